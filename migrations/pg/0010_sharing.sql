ALTER TABLE "endpoints" ADD COLUMN "request_priority" integer;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "bulk_header" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "priority_refused_at" bigint;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "share" jsonb;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "schedule" jsonb;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "timezone" text DEFAULT 'UTC' NOT NULL;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "lend_until" bigint;--> statement-breakpoint
ALTER TABLE "endpoints" ADD COLUMN "drain_grace_ms" integer;