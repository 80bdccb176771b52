CREATE TABLE `sample_turns` (
	`sample_id` integer NOT NULL,
	`idx` integer NOT NULL,
	`run_id` text NOT NULL,
	`content` text,
	`reasoning_content` text,
	`finish_reason` text,
	`prompt_tokens` integer NOT NULL,
	`completion_tokens` integer NOT NULL,
	`reasoning_tokens` integer NOT NULL,
	`cached_tokens` integer NOT NULL,
	`endpoint_id` text,
	`latency_ms` integer NOT NULL,
	`attempts` integer NOT NULL,
	`flags` integer DEFAULT 0 NOT NULL,
	PRIMARY KEY(`sample_id`, `idx`)
);
--> statement-breakpoint
CREATE INDEX `sample_turns_run_idx` ON `sample_turns` (`run_id`);--> statement-breakpoint
ALTER TABLE `runs` ADD `turns_total` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `turns_completed` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `turns_failed` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `turns_max` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `samples` ADD `turn` integer;--> statement-breakpoint
ALTER TABLE `samples` ADD `affinity_endpoint_id` text;--> statement-breakpoint
CREATE INDEX `samples_underway_idx` ON `samples` (`run_id`,`seq`) WHERE status = 'pending' AND turn > 0;