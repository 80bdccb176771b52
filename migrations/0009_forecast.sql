CREATE TABLE `forecasts` (
	`id` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`run_id` text NOT NULL,
	`at` integer NOT NULL,
	`finishes_at` integer,
	`low_at` integer,
	`high_at` integer,
	`completion_tokens_estimate` integer NOT NULL,
	`fraction` real NOT NULL,
	FOREIGN KEY (`run_id`) REFERENCES `runs`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE INDEX `forecasts_run_idx` ON `forecasts` (`run_id`,`at`);--> statement-breakpoint
ALTER TABLE `runs` ADD `calibration_samples` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `dry_run` integer DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `deadline_seconds` integer;--> statement-breakpoint
ALTER TABLE `runs` ADD `dispatch_order` text DEFAULT 'input' NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `predicted_samples` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `forecast` text;--> statement-breakpoint
ALTER TABLE `samples` ADD `calibration` integer DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE `samples` ADD `predicted_tokens` integer;--> statement-breakpoint
CREATE INDEX `samples_calibration_idx` ON `samples` (`run_id`,`status`,`seq`) WHERE calibration = 1;