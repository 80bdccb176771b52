import { and, eq, sql } from 'drizzle-orm';
import type { Db } from './client.js';
import { shards, type ShardRow } from './schema.js';

/** Open shards of a run whose samples are all terminal: ready to upload, at most `limit`. */
export function closedOpenShards(db: Db, runId: string, limit: number): ShardRow[] {
  return db
    .select()
    .from(shards)
    .where(and(eq(shards.runId, runId), eq(shards.status, 'open'), sql`${shards.terminalCount} = ${shards.sampleCount}`))
    .limit(limit)
    .all();
}

export function recordUploadFailure(db: Db, runId: string, idx: number, attempts: number, lastError: string): void {
  db.update(shards).set({ uploadAttempts: attempts, lastError }).where(and(eq(shards.runId, runId), eq(shards.idx, idx))).run();
}
