ALTER TABLE `runs` ADD `output_format` text DEFAULT 'jsonl' NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `eval_share` real;--> statement-breakpoint
ALTER TABLE `samples` ADD `split` text;--> statement-breakpoint
ALTER TABLE `shards` ADD `split` text;--> statement-breakpoint
ALTER TABLE `shards` ADD `last_seq` integer;