ALTER TABLE `samples` ADD `reasoning_chars` integer;--> statement-breakpoint
ALTER TABLE `samples` ADD `content_chars` integer;--> statement-breakpoint
CREATE INDEX `samples_completion_tokens_idx` ON `samples` (`run_id`,`completion_tokens`) WHERE status = 'completed';--> statement-breakpoint
CREATE INDEX `samples_reasoning_chars_idx` ON `samples` (`run_id`,`reasoning_chars`) WHERE status = 'completed';--> statement-breakpoint
CREATE INDEX `samples_content_chars_idx` ON `samples` (`run_id`,`content_chars`) WHERE status = 'completed';--> statement-breakpoint
CREATE INDEX `samples_flag_empty_content_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 1) <> 0;--> statement-breakpoint
CREATE INDEX `samples_flag_missing_reasoning_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 2) <> 0;--> statement-breakpoint
CREATE INDEX `samples_flag_truncated_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 4) <> 0;--> statement-breakpoint
CREATE INDEX `samples_flag_repetitive_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 8) <> 0;--> statement-breakpoint
CREATE INDEX `samples_flag_too_short_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 16) <> 0;