ALTER TABLE `runs` ADD `flag_duplicate_content` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `flag_think_in_content` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `flag_short_for_run` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
CREATE INDEX `samples_flag_duplicate_content_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 32) <> 0;--> statement-breakpoint
CREATE INDEX `samples_flag_think_in_content_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 64) <> 0;--> statement-breakpoint
CREATE INDEX `samples_flag_short_for_run_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 128) <> 0;