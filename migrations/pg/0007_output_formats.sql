ALTER TABLE "runs" ADD COLUMN "output_format" text DEFAULT 'jsonl' NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "eval_share" double precision;--> statement-breakpoint
ALTER TABLE "samples" ADD COLUMN "split" text;--> statement-breakpoint
ALTER TABLE "shards" ADD COLUMN "split" text;--> statement-breakpoint
ALTER TABLE "shards" ADD COLUMN "last_seq" bigint;