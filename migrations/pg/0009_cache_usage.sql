CREATE TABLE "run_endpoint_usage" (
	"run_id" text NOT NULL,
	"endpoint_id" text NOT NULL,
	"prompt_tokens" bigint DEFAULT 0 NOT NULL,
	"cached_tokens" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "run_endpoint_usage_run_id_endpoint_id_pk" PRIMARY KEY("run_id","endpoint_id")
);
--> statement-breakpoint
ALTER TABLE "run_endpoint_usage" ADD CONSTRAINT "run_endpoint_usage_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
-- Runs answered before this table existed get their figures from their completed samples.
INSERT INTO run_endpoint_usage (run_id, endpoint_id, prompt_tokens, cached_tokens)
  SELECT run_id, endpoint_id, sum(coalesce(prompt_tokens, 0)), sum(coalesce(cached_tokens, 0)) FROM samples
  WHERE status = 'completed' AND endpoint_id IS NOT NULL AND run_id IN (SELECT id FROM runs) GROUP BY run_id, endpoint_id;
