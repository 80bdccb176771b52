CREATE TABLE "sample_turns" (
	"sample_id" bigint NOT NULL,
	"idx" integer NOT NULL,
	"run_id" text NOT NULL,
	"content" text,
	"reasoning_content" text,
	"finish_reason" text,
	"prompt_tokens" integer NOT NULL,
	"completion_tokens" integer NOT NULL,
	"reasoning_tokens" integer NOT NULL,
	"cached_tokens" integer NOT NULL,
	"endpoint_id" text,
	"latency_ms" integer NOT NULL,
	"attempts" integer NOT NULL,
	"flags" integer DEFAULT 0 NOT NULL,
	CONSTRAINT "sample_turns_sample_id_idx_pk" PRIMARY KEY("sample_id","idx")
);
--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "turns_total" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "turns_completed" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "turns_failed" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "turns_max" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "samples" ADD COLUMN "turn" integer;--> statement-breakpoint
ALTER TABLE "samples" ADD COLUMN "affinity_endpoint_id" text;--> statement-breakpoint
CREATE INDEX "sample_turns_run_idx" ON "sample_turns" USING btree ("run_id");--> statement-breakpoint
CREATE INDEX "samples_underway_idx" ON "samples" USING btree ("run_id","seq") WHERE status = 'pending' AND turn > 0;