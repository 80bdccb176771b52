ALTER TABLE `runs` ADD `output_overwrite` integer DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `output_folder` text;