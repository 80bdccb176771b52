import { and, asc, eq, gt } from 'drizzle-orm';
import type { DbOrTx } from './client.js';

export type RunEventType = 'status' | 'shard_uploaded' | 'gate' | 'endpoint_quarantined';

/**
 * Records a run event. Readers page through a run's events by id, so ids must grow in the order
 * events become visible: SQLite commits one writer at a time; on PostgreSQL, where an id is drawn
 * at insert and transactions commit in any order, a per-run lock held to the commit makes the next
 * writer of the run's events wait for it.
 */
export async function appendEvent(db: DbOrTx, runId: string, type: RunEventType, data: Record<string, unknown>, now: number): Promise<void> {
  const { events } = db.t;
  if (db.dialect === 'pg') {
    await db.tx(async (tx) => {
      await tx.exec('select pg_advisory_xact_lock(hashtext(?))', [`regen:events:${runId}`]);
      await tx.q.insert(events).values({ runId, type, data, createdAt: now });
    });
    return;
  }
  await db.write((w) => w.q.insert(events).values({ runId, type, data, createdAt: now }));
}

export async function eventsAfter(db: DbOrTx, runId: string, afterId: number, limit = 500) {
  const { events } = db.t;
  return await db.q
    .select()
    .from(events)
    .where(and(eq(events.runId, runId), gt(events.id, afterId)))
    .orderBy(asc(events.id))
    .limit(limit);
}

export async function hasEvent(db: DbOrTx, runId: string, id: number): Promise<boolean> {
  const { events } = db.t;
  const [row] = await db.q
    .select({ id: events.id })
    .from(events)
    .where(and(eq(events.runId, runId), eq(events.id, id)))
    .limit(1);
  return row !== undefined;
}
