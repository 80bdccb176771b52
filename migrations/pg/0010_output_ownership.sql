ALTER TABLE "runs" ADD COLUMN "output_overwrite" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "output_folder" text;