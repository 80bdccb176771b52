ALTER TABLE "endpoints" ADD COLUMN "request_priority" integer;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "bulk_header" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "priority_refused_at" bigint;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "share" jsonb;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "schedule" jsonb;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "timezone" text DEFAULT 'UTC' NOT NULL;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "lend_until" bigint;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "drain_grace_ms" integer;--> statement-breakpoint
ALTER TABLE "run_variants" ADD COLUMN "flag_tool_call_in_content" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "run_variants" ADD COLUMN "flag_invalid_tool_arguments" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "run_variants" ADD COLUMN "flag_unknown_tool" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "run_variants" ADD COLUMN "flag_tool_mismatch" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "tool_pairing" text;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "on_tool_mismatch" text;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "history_reasoning" text;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "flag_tool_call_in_content" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "flag_invalid_tool_arguments" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "flag_unknown_tool" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "flag_tool_mismatch" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "output_overwrite" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "output_folder" text;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "tool_steps" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "sample_turns" ADD COLUMN "step" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "sample_turns" ADD COLUMN "tool_calls" text;--> statement-breakpoint
CREATE INDEX "samples_flag_tool_call_in_content_idx" ON "samples" USING btree ("run_id","seq") WHERE (flags & 256) <> 0;--> statement-breakpoint
CREATE INDEX "samples_flag_invalid_tool_arguments_idx" ON "samples" USING btree ("run_id","seq") WHERE (flags & 512) <> 0;--> statement-breakpoint
CREATE INDEX "samples_flag_unknown_tool_idx" ON "samples" USING btree ("run_id","seq") WHERE (flags & 1024) <> 0;--> statement-breakpoint
CREATE INDEX "samples_flag_tool_mismatch_idx" ON "samples" USING btree ("run_id","seq") WHERE (flags & 2048) <> 0;