ALTER TABLE `runs` ADD `batch_id` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `completion_window` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `expires_at` integer;--> statement-breakpoint
ALTER TABLE `runs` ADD `expired_at` integer;--> statement-breakpoint
ALTER TABLE `runs` ADD `output_file_id` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `error_file_id` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `batch_file_bytes` text;--> statement-breakpoint
CREATE UNIQUE INDEX `runs_batch_id_unique` ON `runs` (`batch_id`);--> statement-breakpoint
CREATE UNIQUE INDEX `runs_output_file_id_unique` ON `runs` (`output_file_id`);--> statement-breakpoint
CREATE UNIQUE INDEX `runs_error_file_id_unique` ON `runs` (`error_file_id`);