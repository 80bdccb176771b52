ALTER TABLE "files" ADD COLUMN "expires_at" bigint;--> statement-breakpoint
ALTER TABLE "files" ADD COLUMN "expired_at" bigint;--> statement-breakpoint
ALTER TABLE "run_variants" ADD COLUMN "flag_few_trainable" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "endpoint" text;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "flag_few_trainable" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "output_expires_after" integer;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "output_expired_at" bigint;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "output_tokens" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "sample_turns" ADD COLUMN "token_ids" text;--> statement-breakpoint
ALTER TABLE "shards" ADD COLUMN "tokens_key" text;--> statement-breakpoint
ALTER TABLE "shards" ADD COLUMN "tokens_bytes" bigint;--> statement-breakpoint
ALTER TABLE "shards" ADD COLUMN "tokens_rows" integer;--> statement-breakpoint
ALTER TABLE "shards" ADD COLUMN "tokens_sha256" text;--> statement-breakpoint
ALTER TABLE "shards" ADD COLUMN "tokens_trainable" text;--> statement-breakpoint
CREATE INDEX "samples_flag_few_trainable_idx" ON "samples" USING btree ("run_id","seq") WHERE (flags & 4096) <> 0;