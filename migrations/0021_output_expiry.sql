ALTER TABLE `files` ADD `expires_at` integer;--> statement-breakpoint
ALTER TABLE `files` ADD `expired_at` integer;--> statement-breakpoint
ALTER TABLE `runs` ADD `output_expires_after` integer;--> statement-breakpoint
ALTER TABLE `runs` ADD `output_expired_at` integer;