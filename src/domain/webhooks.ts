import { createHmac, randomBytes } from 'node:crypto';
import type { RunStatus } from './statuses.js';

// Signed webhook events (README "Webhooks"). Signatures follow the Standard Webhooks scheme
// (standardwebhooks.com, spec 1.0.0, "Signature scheme"); the payload is OpenAI's webhook event
// `{id, object: "event", created_at, type, data: {id}}`, whose batch.* names regen sends for batches.

/** The run statuses that send an event: the ends of a run, and a pause that waits for someone. */
export const WEBHOOK_RUN_STATUSES = ['completed', 'failed', 'cancelled', 'paused'] as const satisfies readonly RunStatus[];
export type WebhookRunStatus = (typeof WEBHOOK_RUN_STATUSES)[number];

/** Every event type regen sends; `batch.*` are OpenAI's names for the same ends of a batch. */
export const WEBHOOK_EVENT_TYPES = [
  'run.completed',
  'run.failed',
  'run.cancelled',
  'run.paused',
  'batch.completed',
  'batch.failed',
  'batch.cancelled',
  'batch.expired',
  'endpoint.quarantined',
] as const;
export type WebhookEventType = (typeof WEBHOOK_EVENT_TYPES)[number];

export const DELIVERY_STATUSES = ['pending', 'delivered', 'failed'] as const;
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number];

export function isWebhookRunStatus(s: RunStatus): s is WebhookRunStatus {
  return (WEBHOOK_RUN_STATUSES as readonly RunStatus[]).includes(s);
}

/** What the event of a run's move says: for a batch's run, OpenAI's batch event (a pause has none, so it stays a run's). */
export function runEvent(
  run: { id: string; batchId: string | null; expiredAt: number | null; dryRun: boolean },
  to: WebhookRunStatus,
  reason: string | null,
): { type: WebhookEventType; data: Record<string, unknown> } {
  if (run.batchId && to !== 'paused') {
    return { type: to === 'cancelled' && run.expiredAt !== null ? 'batch.expired' : `batch.${to}`, data: { id: run.batchId } };
  }
  // A dry run's completion is a forecast, not output to take: its receivers must be able to tell.
  return {
    type: `run.${to}`,
    data: { id: run.id, ...(run.batchId ? { batch_id: run.batchId } : {}), ...(run.dryRun ? { dry_run: true } : {}), status_reason: reason },
  };
}

/** The body as sent, byte for byte on every attempt: the signature covers it. */
export function eventBody(id: string, type: WebhookEventType, data: Record<string, unknown>, now: number): string {
  return JSON.stringify({ id, object: 'event', created_at: Math.floor(now / 1000), type, data });
}

/** An event id: also the `webhook-id` of every attempt, which receivers dedupe on. */
export function newEventId(): string {
  return `evt_${Date.now().toString(36).padStart(9, '0')}${randomBytes(8).toString('hex')}`;
}

const SECRET_PREFIX = 'whsec_';
// The spec's symmetric signing secret: "Random. At least 24 bytes", at most 64.
const SECRET_MIN_BYTES = 24;
const SECRET_MAX_BYTES = 64;
export const SECRET_MESSAGE = `expected "${SECRET_PREFIX}" followed by the base64 of ${SECRET_MIN_BYTES} to ${SECRET_MAX_BYTES} random bytes`;

/** The HMAC key of a `whsec_<base64>` secret, or null when it is not one. */
function secretKey(secret: string): Buffer | null {
  if (!secret.startsWith(SECRET_PREFIX)) return null;
  const b64 = secret.slice(SECRET_PREFIX.length);
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(b64) || b64.length % 4 !== 0) return null;
  const key = Buffer.from(b64, 'base64');
  return key.length >= SECRET_MIN_BYTES && key.length <= SECRET_MAX_BYTES ? key : null;
}

export function isWebhookSecret(secret: string): boolean {
  return secretKey(secret) !== null;
}

/** The three Standard Webhooks headers of one attempt: `timestamp` is the attempt's, in Unix seconds. */
export function signatureHeaders(secret: string, id: string, timestamp: number, body: string): Record<string, string> {
  const key = secretKey(secret);
  if (!key) throw new Error('not a webhook signing secret');
  const signature = createHmac('sha256', key).update(`${id}.${timestamp}.${body}`).digest('base64');
  return { 'webhook-id': id, 'webhook-timestamp': String(timestamp), 'webhook-signature': `v1,${signature}` };
}
