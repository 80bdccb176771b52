ALTER TABLE `endpoints` ADD `request_priority` integer;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `bulk_header` integer DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `priority_refused_at` integer;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `share` text;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `schedule` text;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `timezone` text DEFAULT 'UTC' NOT NULL;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `lend_until` integer;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `drain_grace_ms` integer;--> statement-breakpoint
ALTER TABLE `run_variants` ADD `flag_tool_call_in_content` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `run_variants` ADD `flag_invalid_tool_arguments` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `run_variants` ADD `flag_unknown_tool` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `run_variants` ADD `flag_tool_mismatch` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `tool_pairing` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `on_tool_mismatch` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `history_reasoning` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `flag_tool_call_in_content` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `flag_invalid_tool_arguments` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `flag_unknown_tool` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `flag_tool_mismatch` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `output_overwrite` integer DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `output_folder` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `tool_steps` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `sample_turns` ADD `step` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `sample_turns` ADD `tool_calls` text;--> statement-breakpoint
CREATE INDEX `samples_flag_tool_call_in_content_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 256) <> 0;--> statement-breakpoint
CREATE INDEX `samples_flag_invalid_tool_arguments_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 512) <> 0;--> statement-breakpoint
CREATE INDEX `samples_flag_unknown_tool_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 1024) <> 0;--> statement-breakpoint
CREATE INDEX `samples_flag_tool_mismatch_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 2048) <> 0;