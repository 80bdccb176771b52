CREATE TABLE `run_variants` (
	`run_id` text NOT NULL,
	`idx` integer NOT NULL,
	`total` integer DEFAULT 0 NOT NULL,
	`completed` integer DEFAULT 0 NOT NULL,
	`failed` integer DEFAULT 0 NOT NULL,
	`flagged` integer DEFAULT 0 NOT NULL,
	`flag_empty_content` integer DEFAULT 0 NOT NULL,
	`flag_missing_reasoning` integer DEFAULT 0 NOT NULL,
	`flag_truncated` integer DEFAULT 0 NOT NULL,
	`flag_repetitive` integer DEFAULT 0 NOT NULL,
	`flag_too_short` integer DEFAULT 0 NOT NULL,
	`flag_duplicate_content` integer DEFAULT 0 NOT NULL,
	`flag_think_in_content` integer DEFAULT 0 NOT NULL,
	`flag_short_for_run` integer DEFAULT 0 NOT NULL,
	`prompt_tokens` integer DEFAULT 0 NOT NULL,
	`completion_tokens` integer DEFAULT 0 NOT NULL,
	`reasoning_tokens` integer DEFAULT 0 NOT NULL,
	PRIMARY KEY(`run_id`, `idx`),
	FOREIGN KEY (`run_id`) REFERENCES `runs`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
ALTER TABLE `runs` ADD `variants` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `on_length` text DEFAULT 'keep' NOT NULL;--> statement-breakpoint
ALTER TABLE `samples` ADD `variant` integer;--> statement-breakpoint
ALTER TABLE `samples` ADD `max_tokens` integer;