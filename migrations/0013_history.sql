CREATE TABLE `history` (
	`id` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`run_id` text,
	`step_ms` integer NOT NULL,
	`at` integer NOT NULL,
	`span_ms` integer NOT NULL,
	`samples` integer NOT NULL,
	`completion_tokens` integer NOT NULL,
	`prompt_tokens` integer NOT NULL,
	`cached_tokens` integer NOT NULL,
	`in_flight` real,
	`cap` real,
	`endpoints` text,
	FOREIGN KEY (`run_id`) REFERENCES `runs`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE INDEX `history_run_idx` ON `history` (`run_id`,`step_ms`,`at`);