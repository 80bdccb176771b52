CREATE TABLE `endpoint_drivers` (
	`endpoint_id` text PRIMARY KEY NOT NULL,
	`owner` text NOT NULL,
	`since` integer NOT NULL,
	FOREIGN KEY (`endpoint_id`) REFERENCES `endpoints`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE TABLE `replicas` (
	`owner` text PRIMARY KEY NOT NULL,
	`pid` integer NOT NULL,
	`hostname` text NOT NULL,
	`heartbeat_at` integer NOT NULL,
	`view` text
);
--> statement-breakpoint
ALTER TABLE `runner_lock` DROP COLUMN `view`;