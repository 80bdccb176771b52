import { and, asc, eq, gte, lt, sql } from 'drizzle-orm';
import { type Db, type DbOrTx, IMMEDIATE } from './client.js';
import { appendEvent } from './events.js';
import { runs, samples, shards, staging, type ShardRow } from './schema.js';

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
  db.update(shards)
    .set({ uploadAttempts: attempts, lastError })
    .where(and(eq(shards.runId, runId), eq(shards.idx, idx)))
    .run();
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

/** A shard's samples in input order, each with its staged output while the shard is open. */
export function shardSamplesWithOutput(db: DbOrTx, runId: string, shard: Pick<ShardRow, 'firstSeq' | 'sampleCount'>) {
  return (
    db
      .select({ s: samples, output: staging.output })
      .from(samples)
      .leftJoin(staging, eq(staging.sampleId, samples.id))
      // A seq range is what the (run_id, seq) index serves; filtering on shard_idx would read the whole run.
      .where(and(eq(samples.runId, runId), gte(samples.seq, shard.firstSeq), lt(samples.seq, shard.firstSeq + shard.sampleCount)))
      .orderBy(asc(samples.seq))
      .all()
  );
}

export type UploadedShard = Pick<ShardRow, 'key' | 'bytes' | 'lines' | 'sha256' | 'errorsKey' | 'errorsBytes' | 'errorsLines' | 'errorsSha256'> & {
  lineOf: { id: number; line: number }[];
  errorCount: number;
};

/**
 * Marks a shard uploaded with what was written, points its samples at their lines, drops its
 * staging rows and records the event, in one transaction. False, changing nothing, when a retry
 * reopened samples of the shard while the upload ran (its generation moved): that upload is stale.
 */
export function markShardUploaded(db: Db, runId: string, shard: Pick<ShardRow, 'idx' | 'generation'>, up: UploadedShard, now: number): boolean {
  const { lineOf, errorCount, ...written } = up;
  return db.transaction((tx) => {
    const current = tx
      .select()
      .from(shards)
      .where(and(eq(shards.runId, runId), eq(shards.idx, shard.idx)))
      .get();
    if (!current || current.status !== 'open' || current.generation !== shard.generation || current.terminalCount !== current.sampleCount) {
      return false;
    }
    tx.update(shards)
      .set({ status: 'uploaded', ...written, uploadedAt: now, lastError: null })
      .where(and(eq(shards.runId, runId), eq(shards.idx, shard.idx)))
      .run();
    const setLine = db.$client.prepare('update samples set output_key = ?, output_line = ? where id = ?');
    for (const l of lineOf) setLine.run(up.key, l.line, l.id);
    tx.delete(staging)
      .where(and(eq(staging.runId, runId), eq(staging.shardIdx, shard.idx)))
      .run();
    tx.update(runs)
      .set({ shardsUploaded: sql`${runs.shardsUploaded} + 1`, updatedAt: now })
      .where(eq(runs.id, runId))
      .run();
    appendEvent(tx, runId, 'shard_uploaded', { shard: shard.idx, key: up.key, lines: up.lines, errors: errorCount }, now);
    return true;
  }, IMMEDIATE);
}

export function listRunShards(db: DbOrTx, runId: string): ShardRow[] {
  return db.select().from(shards).where(eq(shards.runId, runId)).orderBy(asc(shards.idx)).all();
}
