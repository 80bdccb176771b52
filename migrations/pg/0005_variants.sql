CREATE TABLE "run_variants" (
	"run_id" text NOT NULL,
	"idx" integer NOT NULL,
	"total" bigint DEFAULT 0 NOT NULL,
	"completed" bigint DEFAULT 0 NOT NULL,
	"failed" bigint DEFAULT 0 NOT NULL,
	"flagged" bigint DEFAULT 0 NOT NULL,
	"flag_empty_content" bigint DEFAULT 0 NOT NULL,
	"flag_missing_reasoning" bigint DEFAULT 0 NOT NULL,
	"flag_truncated" bigint DEFAULT 0 NOT NULL,
	"flag_repetitive" bigint DEFAULT 0 NOT NULL,
	"flag_too_short" bigint DEFAULT 0 NOT NULL,
	"flag_duplicate_content" bigint DEFAULT 0 NOT NULL,
	"flag_think_in_content" bigint DEFAULT 0 NOT NULL,
	"flag_short_for_run" bigint DEFAULT 0 NOT NULL,
	"prompt_tokens" bigint DEFAULT 0 NOT NULL,
	"completion_tokens" bigint DEFAULT 0 NOT NULL,
	"reasoning_tokens" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "run_variants_run_id_idx_pk" PRIMARY KEY("run_id","idx")
);
--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "variants" jsonb;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "on_length" text DEFAULT 'keep' NOT NULL;--> statement-breakpoint
ALTER TABLE "samples" ADD COLUMN "variant" integer;--> statement-breakpoint
ALTER TABLE "samples" ADD COLUMN "max_tokens" integer;--> statement-breakpoint
ALTER TABLE "run_variants" ADD CONSTRAINT "run_variants_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;