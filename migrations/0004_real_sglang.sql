ALTER TABLE `endpoints` ADD `kv_tokens` integer;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `max_model_len` integer;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `startup_time` real;--> statement-breakpoint
ALTER TABLE `endpoints` ADD `aliases` text DEFAULT '[]' NOT NULL;--> statement-breakpoint
ALTER TABLE `samples` ADD `server_faults` integer DEFAULT 0 NOT NULL;