CREATE TABLE `endpoints` (
	`id` text PRIMARY KEY NOT NULL,
	`url` text NOT NULL,
	`name` text NOT NULL,
	`api_key` text,
	`model` text,
	`state` text DEFAULT 'starting' NOT NULL,
	`max_concurrency` integer,
	`server_max_running` integer,
	`weight` real DEFAULT 1 NOT NULL,
	`labels` text DEFAULT '{}' NOT NULL,
	`last_error` text,
	`last_checked_at` integer,
	`completed` integer DEFAULT 0 NOT NULL,
	`failed` integer DEFAULT 0 NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX `endpoints_url_unique` ON `endpoints` (`url`);--> statement-breakpoint
CREATE TABLE `events` (
	`id` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`run_id` text NOT NULL,
	`type` text NOT NULL,
	`data` text NOT NULL,
	`created_at` integer NOT NULL
);
--> statement-breakpoint
CREATE INDEX `events_run_idx` ON `events` (`run_id`,`id`);--> statement-breakpoint
CREATE TABLE `files` (
	`id` text PRIMARY KEY NOT NULL,
	`filename` text NOT NULL,
	`purpose` text NOT NULL,
	`bytes` integer NOT NULL,
	`object_key` text NOT NULL,
	`created_at` integer NOT NULL
);
--> statement-breakpoint
CREATE TABLE `runner_lock` (
	`id` integer PRIMARY KEY NOT NULL,
	`owner` text NOT NULL,
	`pid` integer NOT NULL,
	`hostname` text NOT NULL,
	`heartbeat_at` integer NOT NULL
);
--> statement-breakpoint
CREATE TABLE `runs` (
	`id` text PRIMARY KEY NOT NULL,
	`name` text,
	`model` text NOT NULL,
	`status` text NOT NULL,
	`status_reason` text,
	`created_at` integer NOT NULL,
	`started_at` integer,
	`finished_at` integer,
	`params` text NOT NULL,
	`input` text NOT NULL,
	`shard_size` integer NOT NULL,
	`output_uri` text NOT NULL,
	`priority` integer DEFAULT 0 NOT NULL,
	`metadata` text NOT NULL,
	`regenerate` text,
	`on_invalid_line` text NOT NULL,
	`quality` text,
	`gate_overridden` integer DEFAULT false NOT NULL,
	`request_timeout_ms` integer NOT NULL,
	`max_attempts` integer NOT NULL,
	`idempotency_key` text,
	`request_hash` text,
	`invalid_lines` integer DEFAULT 0 NOT NULL,
	`line_errors` text DEFAULT '[]' NOT NULL,
	`total` integer DEFAULT 0 NOT NULL,
	`pending` integer DEFAULT 0 NOT NULL,
	`in_progress` integer DEFAULT 0 NOT NULL,
	`completed` integer DEFAULT 0 NOT NULL,
	`failed` integer DEFAULT 0 NOT NULL,
	`cancelled` integer DEFAULT 0 NOT NULL,
	`flagged` integer DEFAULT 0 NOT NULL,
	`flag_empty_content` integer DEFAULT 0 NOT NULL,
	`flag_missing_reasoning` integer DEFAULT 0 NOT NULL,
	`flag_truncated` integer DEFAULT 0 NOT NULL,
	`flag_repetitive` integer DEFAULT 0 NOT NULL,
	`flag_too_short` integer DEFAULT 0 NOT NULL,
	`prompt_tokens` integer DEFAULT 0 NOT NULL,
	`completion_tokens` integer DEFAULT 0 NOT NULL,
	`reasoning_tokens` integer DEFAULT 0 NOT NULL,
	`shards_total` integer DEFAULT 0 NOT NULL,
	`shards_uploaded` integer DEFAULT 0 NOT NULL,
	`dropped_results` integer DEFAULT 0 NOT NULL,
	`manifest_key` text,
	`updated_at` integer NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX `runs_idempotency_key_unique` ON `runs` (`idempotency_key`);--> statement-breakpoint
CREATE INDEX `runs_status_idx` ON `runs` (`status`,`priority`,`created_at`);--> statement-breakpoint
CREATE TABLE `samples` (
	`id` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`run_id` text NOT NULL,
	`seq` integer NOT NULL,
	`shard_idx` integer NOT NULL,
	`custom_id` text NOT NULL,
	`status` text DEFAULT 'pending' NOT NULL,
	`request` text NOT NULL,
	`attempts` integer DEFAULT 0 NOT NULL,
	`quality_retries` integer DEFAULT 0 NOT NULL,
	`available_at` integer DEFAULT 0 NOT NULL,
	`lease_owner` text,
	`lease_expires_at` integer,
	`endpoint_id` text,
	`finish_reason` text,
	`prompt_tokens` integer,
	`completion_tokens` integer,
	`reasoning_tokens` integer,
	`cached_tokens` integer,
	`latency_ms` integer,
	`flags` integer DEFAULT 0 NOT NULL,
	`error_code` text,
	`error_message` text,
	`error_status` integer,
	`output_key` text,
	`output_line` integer,
	`completed_at` integer
);
--> statement-breakpoint
CREATE UNIQUE INDEX `samples_run_custom_id` ON `samples` (`run_id`,`custom_id`);--> statement-breakpoint
CREATE INDEX `samples_claim_idx` ON `samples` (`run_id`,`status`,`seq`);--> statement-breakpoint
CREATE INDEX `samples_run_seq_idx` ON `samples` (`run_id`,`seq`);--> statement-breakpoint
CREATE TABLE `shards` (
	`run_id` text NOT NULL,
	`idx` integer NOT NULL,
	`status` text DEFAULT 'open' NOT NULL,
	`first_seq` integer NOT NULL,
	`sample_count` integer NOT NULL,
	`terminal_count` integer DEFAULT 0 NOT NULL,
	`key` text,
	`bytes` integer,
	`lines` integer,
	`sha256` text,
	`errors_key` text,
	`errors_bytes` integer,
	`errors_lines` integer,
	`errors_sha256` text,
	`upload_attempts` integer DEFAULT 0 NOT NULL,
	`last_error` text,
	`uploaded_at` integer,
	PRIMARY KEY(`run_id`, `idx`),
	FOREIGN KEY (`run_id`) REFERENCES `runs`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE INDEX `shards_status_idx` ON `shards` (`status`);--> statement-breakpoint
CREATE TABLE `staging` (
	`sample_id` integer PRIMARY KEY NOT NULL,
	`run_id` text NOT NULL,
	`shard_idx` integer NOT NULL,
	`output` text NOT NULL
);
