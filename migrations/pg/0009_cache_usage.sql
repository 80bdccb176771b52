CREATE TABLE "run_endpoint_usage" (
	"run_id" text NOT NULL,
	"endpoint_id" text NOT NULL,
	"prompt_tokens" bigint DEFAULT 0 NOT NULL,
	"cached_tokens" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "run_endpoint_usage_run_id_endpoint_id_pk" PRIMARY KEY("run_id","endpoint_id")
);
--> statement-breakpoint
ALTER TABLE "run_endpoint_usage" ADD CONSTRAINT "run_endpoint_usage_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;