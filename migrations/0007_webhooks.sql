CREATE TABLE `webhook_deliveries` (
	`id` text PRIMARY KEY NOT NULL,
	`run_id` text,
	`type` text NOT NULL,
	`url` text NOT NULL,
	`body` text NOT NULL,
	`status` text DEFAULT 'pending' NOT NULL,
	`attempts` integer DEFAULT 0 NOT NULL,
	`next_attempt_at` integer NOT NULL,
	`last_error` text,
	`created_at` integer NOT NULL,
	`delivered_at` integer
);
--> statement-breakpoint
CREATE INDEX `webhook_deliveries_due_idx` ON `webhook_deliveries` (`next_attempt_at`) WHERE status = 'pending';--> statement-breakpoint
ALTER TABLE `runs` ADD `webhook_url` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `webhook_secret` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `webhook_pending` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `webhook_delivered` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `webhook_failed` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `webhook_last_error` text;