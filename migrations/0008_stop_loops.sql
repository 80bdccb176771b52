ALTER TABLE `runs` ADD `loops_stopped` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `loop_tokens_saved` integer DEFAULT 0 NOT NULL;