ALTER TABLE `files` ADD `expires_at` integer;--> statement-breakpoint
ALTER TABLE `files` ADD `expired_at` integer;--> statement-breakpoint
ALTER TABLE `run_variants` ADD `flag_few_trainable` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `endpoint` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `flag_few_trainable` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `output_expires_after` integer;--> statement-breakpoint
ALTER TABLE `runs` ADD `output_expired_at` integer;--> statement-breakpoint
ALTER TABLE `runs` ADD `output_tokens` integer DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE `sample_turns` ADD `token_ids` text;--> statement-breakpoint
ALTER TABLE `shards` ADD `tokens_key` text;--> statement-breakpoint
ALTER TABLE `shards` ADD `tokens_bytes` integer;--> statement-breakpoint
ALTER TABLE `shards` ADD `tokens_rows` integer;--> statement-breakpoint
ALTER TABLE `shards` ADD `tokens_sha256` text;--> statement-breakpoint
ALTER TABLE `shards` ADD `tokens_trainable` text;--> statement-breakpoint
CREATE INDEX `samples_flag_few_trainable_idx` ON `samples` (`run_id`,`seq`) WHERE (flags & 4096) <> 0;