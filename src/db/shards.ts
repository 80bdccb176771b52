import { and, eq, sql } from 'drizzle-orm';
import type { Db, DbOrTx } from './client.js';
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

// Rows per multi-row insert: a validated run may have thousands of shards, and one statement
// for all of them could pass SQLite's limit on bound values.
const SHARDS_PER_INSERT = 500;

/** Lays out a validated run's shards: contiguous slices of `shardSize` samples, the last one shorter. */
export function insertShardLayout(db: DbOrTx, runId: string, shardSize: number, sampleCount: number): number {
  const shardCount = Math.ceil(sampleCount / shardSize);
  for (let i = 0; i < shardCount; i += SHARDS_PER_INSERT) {
    const rows = [];
    for (let idx = i; idx < Math.min(shardCount, i + SHARDS_PER_INSERT); idx++) {
      rows.push({ runId, idx, firstSeq: idx * shardSize, sampleCount: Math.min(shardSize, sampleCount - idx * shardSize) });
    }
    db.insert(shards).values(rows).run();
  }
  return shardCount;
}

/**
 * Reopens the shards whose samples a retry put back (`requeued`: shard index → samples requeued):
 * they count those samples as not done and start a new generation, so an upload already under way
 * is stale. Returns how many of them had been uploaded.
 */
export function reopenShards(db: DbOrTx, runId: string, requeued: Map<number, number>): number {
  let reopenedUploaded = 0;
  for (const [idx, n] of requeued) {
    const at = and(eq(shards.runId, runId), eq(shards.idx, idx));
    const shard = db.select().from(shards).where(at).get()!;
    if (shard.status === 'uploaded') reopenedUploaded++;
    db.update(shards)
      .set({ status: 'open', terminalCount: shard.terminalCount - n, generation: shard.generation + 1 })
      .where(at)
      .run();
  }
  return reopenedUploaded;
}
