import { and, asc, eq, gt } from 'drizzle-orm';
import type { DbOrTx } from './client.js';
import { events } from './schema.js';

export type RunEventType = 'status' | 'shard_uploaded' | 'gate' | 'endpoint_quarantined';

export function appendEvent(db: DbOrTx, runId: string, type: RunEventType, data: Record<string, unknown>, now: number): void {
  db.insert(events).values({ runId, type, data, createdAt: now }).run();
}

export async function eventsAfter(db: DbOrTx, runId: string, afterId: number, limit = 500) {
  return await db
    .select()
    .from(events)
    .where(and(eq(events.runId, runId), gt(events.id, afterId)))
    .orderBy(asc(events.id))
    .limit(limit);
}
