DROP INDEX "samples_run_custom_id";--> statement-breakpoint
ALTER TABLE "samples" ADD COLUMN "sample_index" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
CREATE UNIQUE INDEX "samples_run_custom_id" ON "samples" USING btree ("run_id","custom_id","sample_index");