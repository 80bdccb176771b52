import { and, asc, count, eq, inArray, isNotNull, lte, sql } from 'drizzle-orm';
import type { SQLiteUpdateSetSource } from 'drizzle-orm/sqlite-core';
import type { Db, DbOrTx, Tables } from './client.js';
import type { WebhookDeliveryRow } from './schema.js';
import { eventBody, newEventId, runEvent, type WebhookEventType, type WebhookRunStatus } from '../domain/webhooks.js';

/** Puts an event in the outbox, due at once; a run's is counted on the run. Call it in the transaction of the change. */
export async function enqueueEvent(
  db: DbOrTx,
  e: { runId: string | null; url: string; type: WebhookEventType; data: Record<string, unknown> },
  now: number,
): Promise<void> {
  const { webhookDeliveries, runs } = db.t;
  const id = newEventId();
  await db.tx(async (tx) => {
    await tx.q
      .insert(webhookDeliveries)
      .values({ id, runId: e.runId, type: e.type, url: e.url, body: eventBody(id, e.type, e.data, now), nextAttemptAt: now, createdAt: now });
    if (e.runId) await countOnRun(tx, e.runId, { webhookPending: sql`${runs.webhookPending} + 1` });
  });
}

/** The event of a run's move to `to`, when the run has a webhook. */
export async function enqueueRunEvent(db: DbOrTx, runId: string, to: WebhookRunStatus, reason: string | null, now: number): Promise<void> {
  const { runs } = db.t;
  const [run] = await db.q
    .select({ id: runs.id, url: runs.webhookUrl, batchId: runs.batchId, expiredAt: runs.expiredAt, dryRun: runs.dryRun })
    .from(runs)
    .where(eq(runs.id, runId))
    .limit(1);
  if (!run?.url) return;
  await enqueueEvent(db, { runId, url: run.url, ...runEvent(run, to, reason) }, now);
}

/** The runs among `runIds` whose own webhook (not the server's default) should hear of something. */
export async function runsWithOwnWebhook(db: DbOrTx, runIds: string[]): Promise<{ id: string; url: string }[]> {
  if (runIds.length === 0) return [];
  const { runs } = db.t;
  const rows = await db.q
    .select({ id: runs.id, url: runs.webhookUrl })
    .from(runs)
    .where(and(inArray(runs.id, runIds), isNotNull(runs.webhookSecret)));
  return rows.filter((r): r is { id: string; url: string } => r.url !== null);
}

/** Pending events whose next attempt is due, oldest first. */
export async function dueDeliveries(db: Db, now: number, limit: number): Promise<WebhookDeliveryRow[]> {
  const { webhookDeliveries } = db.t;
  return await db.q
    .select()
    .from(webhookDeliveries)
    .where(and(eq(webhookDeliveries.status, 'pending'), lte(webhookDeliveries.nextAttemptAt, now)))
    .orderBy(asc(webhookDeliveries.nextAttemptAt))
    .limit(limit);
}

/**
 * Takes one attempt at an event: charges it and leases the event until `leaseUntil`, after which
 * an attempt that never reported (its process died) is made again. False when another deliverer
 * took it first.
 */
export async function claimDelivery(db: Db, row: WebhookDeliveryRow, leaseUntil: number): Promise<boolean> {
  const { webhookDeliveries } = db.t;
  const taken = await db.write((w) =>
    w.q
      .update(webhookDeliveries)
      .set({ attempts: sql`${webhookDeliveries.attempts} + 1`, nextAttemptAt: leaseUntil })
      .where(and(eq(webhookDeliveries.id, row.id), eq(webhookDeliveries.status, 'pending'), eq(webhookDeliveries.nextAttemptAt, row.nextAttemptAt)))
      .returning({ id: webhookDeliveries.id }),
  );
  return taken.length > 0;
}

/** The signing secret a run's own webhook was given, if any. */
export async function runWebhookSecret(db: Db, runId: string): Promise<string | null> {
  const { runs } = db.t;
  const [row] = await db.q.select({ secret: runs.webhookSecret }).from(runs).where(eq(runs.id, runId)).limit(1);
  return db.secrets.open(row?.secret ?? null);
}

/** The outbox's events by delivery status. */
export async function deliveryCountsByStatus(db: Db): Promise<{ status: string; n: number }[]> {
  const { webhookDeliveries } = db.t;
  return await db.q.select({ status: webhookDeliveries.status, n: count() }).from(webhookDeliveries).groupBy(webhookDeliveries.status);
}

export type DeliveryResult = { kind: 'delivered' } | { kind: 'retry'; at: number; error: string } | { kind: 'failed'; error: string };

/** What an attempt came to; an event already delivered or given up (by another attempt) stays so. */
export async function recordAttempt(db: Db, row: WebhookDeliveryRow, result: DeliveryResult, now: number): Promise<void> {
  const { webhookDeliveries, runs } = db.t;
  await db.tx(async (tx) => {
    const set =
      result.kind === 'delivered'
        ? { status: 'delivered', deliveredAt: now, lastError: null }
        : result.kind === 'retry'
          ? { nextAttemptAt: result.at, lastError: result.error }
          : { status: 'failed', lastError: result.error };
    const recorded = await tx.q
      .update(webhookDeliveries)
      .set(set)
      .where(and(eq(webhookDeliveries.id, row.id), eq(webhookDeliveries.status, 'pending')))
      .returning({ id: webhookDeliveries.id });
    if (recorded.length === 0 || !row.runId) return;
    if (result.kind === 'delivered') {
      await countOnRun(tx, row.runId, {
        webhookPending: sql`${runs.webhookPending} - 1`,
        webhookDelivered: sql`${runs.webhookDelivered} + 1`,
        webhookLastError: null,
      });
    } else if (result.kind === 'failed') {
      await countOnRun(tx, row.runId, {
        webhookPending: sql`${runs.webhookPending} - 1`,
        webhookFailed: sql`${runs.webhookFailed} + 1`,
        webhookLastError: result.error,
      });
    } else {
      await countOnRun(tx, row.runId, { webhookLastError: result.error });
    }
  });
}

async function countOnRun(tx: DbOrTx, runId: string, set: SQLiteUpdateSetSource<Tables['runs']>): Promise<void> {
  const { runs } = tx.t;
  await tx.q.update(runs).set(set).where(eq(runs.id, runId));
}
