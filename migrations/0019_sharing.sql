ALTER TABLE `endpoints` ADD `request_priority` integer;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `bulk_header` integer DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `priority_refused_at` integer;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `share` text;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `schedule` text;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `timezone` text DEFAULT 'UTC' NOT NULL;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `lend_until` integer;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `drain_grace_ms` integer;