CREATE TABLE `run_endpoint_usage` (
	`run_id` text NOT NULL,
	`endpoint_id` text NOT NULL,
	`prompt_tokens` integer DEFAULT 0 NOT NULL,
	`cached_tokens` integer DEFAULT 0 NOT NULL,
	PRIMARY KEY(`run_id`, `endpoint_id`),
	FOREIGN KEY (`run_id`) REFERENCES `runs`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
-- Runs answered before this table existed get their figures from their completed samples.
INSERT INTO run_endpoint_usage (run_id, endpoint_id, prompt_tokens, cached_tokens)
  SELECT run_id, endpoint_id, sum(coalesce(prompt_tokens, 0)), sum(coalesce(cached_tokens, 0)) FROM samples
  WHERE status = 'completed' AND endpoint_id IS NOT NULL AND run_id IN (SELECT id FROM runs) GROUP BY run_id, endpoint_id;
