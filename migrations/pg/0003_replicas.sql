CREATE TABLE "endpoint_drivers" (
	"endpoint_id" text PRIMARY KEY NOT NULL,
	"owner" text NOT NULL,
	"since" bigint NOT NULL
);
--> statement-breakpoint
CREATE TABLE "replicas" (
	"owner" text PRIMARY KEY NOT NULL,
	"pid" integer NOT NULL,
	"hostname" text NOT NULL,
	"heartbeat_at" bigint NOT NULL,
	"view" jsonb
);
--> statement-breakpoint
ALTER TABLE "endpoint_drivers" ADD CONSTRAINT "endpoint_drivers_endpoint_id_endpoints_id_fk" FOREIGN KEY ("endpoint_id") REFERENCES "public"."endpoints"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "runner_lock" DROP COLUMN "view";