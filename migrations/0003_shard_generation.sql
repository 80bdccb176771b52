DROP INDEX `shards_status_idx`;--> statement-breakpoint
ALTER TABLE `shards` ADD `generation` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
CREATE INDEX `shards_run_status_idx` ON `shards` (`run_id`,`status`);--> statement-breakpoint
CREATE INDEX `staging_shard_idx` ON `staging` (`run_id`,`shard_idx`);