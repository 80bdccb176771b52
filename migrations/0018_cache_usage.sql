CREATE TABLE `run_endpoint_usage` (
	`run_id` text NOT NULL,
	`endpoint_id` text NOT NULL,
	`prompt_tokens` integer DEFAULT 0 NOT NULL,
	`cached_tokens` integer DEFAULT 0 NOT NULL,
	PRIMARY KEY(`run_id`, `endpoint_id`),
	FOREIGN KEY (`run_id`) REFERENCES `runs`(`id`) ON UPDATE no action ON DELETE cascade
);
