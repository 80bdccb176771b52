ALTER TABLE "files" ADD COLUMN "expires_at" bigint;--> statement-breakpoint
ALTER TABLE "files" ADD COLUMN "expired_at" bigint;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "output_expires_after" integer;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "output_expired_at" bigint;