import { and, asc, eq, gte, lt, lte, sql } from 'drizzle-orm';
import { type Db, type DbOrTx, locked } from './client.js';
import { appendEvent } from './events.js';
import type { ShardRow } from './schema.js';

/** Open shards of a run whose samples are all terminal: ready to upload, at most `limit`. */
export async function closedOpenShards(db: Db, runId: string, limit: number): Promise<ShardRow[]> {
  const { shards } = db.t;
  return await db.q
    .select()
    .from(shards)
    .where(and(eq(shards.runId, runId), eq(shards.status, 'open'), sql`${shards.terminalCount} = ${shards.sampleCount}`))
    .limit(limit);
}

/** A shard as it is now, while it is still open in `generation`; null once uploaded or reopened since. */
export async function openShardNow(db: Db, runId: string, shard: Pick<ShardRow, 'idx' | 'generation'>): Promise<ShardRow | null> {
  const { shards } = db.t;
  const [row] = await db.q
    .select()
    .from(shards)
    .where(and(eq(shards.runId, runId), eq(shards.idx, shard.idx)))
    .limit(1);
  return row && row.status === 'open' && row.generation === shard.generation ? row : null;
}

/**
 * Records a failed upload of a shard that had `from` failed attempts before it: false, and nothing
 * changed, when the shard's count moved meanwhile (a retry of the run gave it a fresh budget while
 * this upload was under way), so a late failure cannot charge the new budget with the old count.
 */
export async function recordUploadFailure(db: Db, runId: string, idx: number, from: number, lastError: string): Promise<boolean> {
  const { shards } = db.t;
  const set = await db.write((w) =>
    w.q
      .update(shards)
      .set({ uploadAttempts: from + 1, lastError })
      .where(and(eq(shards.runId, runId), eq(shards.idx, idx), eq(shards.status, 'open'), eq(shards.uploadAttempts, from)))
      .returning({ idx: shards.idx }),
  );
  return set.length > 0;
}

/** Gives a run's unwritten shards a fresh upload budget: a retry after the store was fixed. */
export async function resetUploadAttempts(db: DbOrTx, runId: string): Promise<void> {
  const { shards } = db.t;
  await db.write((w) =>
    w.q
      .update(shards)
      .set({ uploadAttempts: 0, lastError: null })
      .where(and(eq(shards.runId, runId), eq(shards.status, 'open'))),
  );
}

// Rows per multi-row insert: a validated run may have thousands of shards, and one statement
// for all of them could pass SQLite's limit on bound values.
const SHARDS_PER_INSERT = 500;

/** Lays out a validated run's shards: contiguous slices of `shardSize` samples, the last one shorter. */
export async function insertShardLayout(db: DbOrTx, runId: string, shardSize: number, sampleCount: number): Promise<number> {
  const { shards } = db.t;
  const shardCount = Math.ceil(sampleCount / shardSize);
  await db.tx(async (tx) => {
    for (let i = 0; i < shardCount; i += SHARDS_PER_INSERT) {
      const rows = [];
      for (let idx = i; idx < Math.min(shardCount, i + SHARDS_PER_INSERT); idx++) {
        rows.push({ runId, idx, firstSeq: idx * shardSize, sampleCount: Math.min(shardSize, sampleCount - idx * shardSize) });
      }
      await tx.q.insert(shards).values(rows);
    }
  });
  return shardCount;
}

/** One shard of a split run, as ingestion counted it. */
export interface SplitShard {
  idx: number;
  split: string;
  firstSeq: number;
  lastSeq: number;
  sampleCount: number;
}

/**
 * Lays out a split run's shards: each split numbers its own, and a shard's samples are those of its
 * `shard_idx` between its first and last seq (the other split's samples sit between them).
 */
export async function insertSplitShardLayout(db: DbOrTx, runId: string, layout: readonly SplitShard[]): Promise<number> {
  const { shards } = db.t;
  await db.tx(async (tx) => {
    for (let i = 0; i < layout.length; i += SHARDS_PER_INSERT) {
      await tx.q.insert(shards).values(layout.slice(i, i + SHARDS_PER_INSERT).map((s) => ({ runId, ...s })));
    }
  });
  return layout.length;
}

/**
 * Reopens the shards whose samples a retry put back (`requeued`: shard index → samples requeued):
 * they count those samples as not done and start a new generation, so an upload already under way
 * is stale. Returns how many of them had been uploaded. Call it in a transaction.
 */
export async function reopenShards(tx: DbOrTx, runId: string, requeued: Map<number, number>): Promise<number> {
  const { shards } = tx.t;
  let reopenedUploaded = 0;
  for (const [idx, n] of requeued) {
    const at = and(eq(shards.runId, runId), eq(shards.idx, idx));
    // The counts move in SQL, from the row as it is when the update runs: nothing read earlier is written back.
    // Locked, so an upload cannot mark the shard between this read and the update.
    const [before] = await locked(tx, tx.q.select({ status: shards.status }).from(shards).where(at).limit(1));
    if (before?.status === 'uploaded') reopenedUploaded++;
    await tx.write((w) =>
      w.q
        .update(shards)
        // A new generation with a fresh upload budget: the failures before its last upload are not
        // this rewrite's, and counted would fail it (or a cancel) sooner than a first upload.
        .set({
          status: 'open',
          terminalCount: sql`${shards.terminalCount} - ${n}`,
          generation: sql`${shards.generation} + 1`,
          uploadAttempts: 0,
          lastError: null,
        })
        .where(at),
    );
  }
  return reopenedUploaded;
}

/** The files an upload was about to store, or remove, without marking its shard after: each key's digests (shards.pending_digests). */
type PendingDigests = Record<string, string[]>;

/** A pending digest that stands for the file's removal: a later upload finds no file at that key. */
export const REMOVED = 'removed';

/**
 * Records the digests of the files an upload is about to store (REMOVED for one it is about to
 * remove), before it touches any: an upload that fails after some of them were stored leaves them
 * in place of those the shard recorded, and the next upload of the shard reads its earlier records
 * back from them. False, recording nothing, once the shard is no longer open in `generation`: the
 * upload is stale and must store nothing.
 */
export async function recordPendingDigests(
  db: Db,
  runId: string,
  shard: Pick<ShardRow, 'idx' | 'generation'>,
  digests: Record<string, string>,
): Promise<boolean> {
  const { shards } = db.t;
  const at = and(eq(shards.runId, runId), eq(shards.idx, shard.idx));
  return db.tx(async (tx) => {
    // Locked on PostgreSQL: a retry reopening the shard, or an upload marking it, waits for this one.
    const [row] = await locked(
      tx,
      tx.q.select({ status: shards.status, generation: shards.generation, pending: shards.pendingDigests }).from(shards).where(at).limit(1),
    );
    if (!row || row.status !== 'open' || row.generation !== shard.generation) return false;
    const pending = (row.pending ? JSON.parse(row.pending) : {}) as PendingDigests;
    let added = false;
    for (const [key, digest] of Object.entries(digests)) {
      const known = (pending[key] ??= []);
      if (known.includes(digest)) continue;
      known.push(digest);
      added = true;
    }
    if (added)
      await tx.write((w) =>
        w.q
          .update(shards)
          .set({ pendingDigests: JSON.stringify(pending) })
          .where(at),
      );
    return true;
  });
}

/**
 * Whether `digest` (REMOVED: no file) is what this shard's uploads left at `key`: the file
 * recorded, or one an upload that did not get to mark the shard was about to store or remove.
 */
export function storedByShard(shard: Pick<ShardRow, 'pendingDigests'>, recorded: string | null, key: string, digest: string): boolean {
  if (digest === recorded) return true;
  const pending = (shard.pendingDigests ? JSON.parse(shard.pendingDigests) : {}) as PendingDigests;
  return pending[key]?.includes(digest) ?? false;
}

/** A shard's samples in input order, each with its staged output while the shard is open. */
export async function shardSamplesWithOutput(db: DbOrTx, runId: string, shard: Pick<ShardRow, 'idx' | 'firstSeq' | 'sampleCount' | 'lastSeq'>) {
  const { samples, staging } = db.t;
  // A seq range is what the (run_id, seq) index serves; filtering on shard_idx alone would read the whole run.
  // A split run's shard spans the other split's samples too: its range is filtered on shard_idx.
  const range =
    shard.lastSeq === null
      ? and(eq(samples.runId, runId), gte(samples.seq, shard.firstSeq), lt(samples.seq, shard.firstSeq + shard.sampleCount))
      : and(eq(samples.runId, runId), gte(samples.seq, shard.firstSeq), lte(samples.seq, shard.lastSeq), eq(samples.shardIdx, shard.idx));
  return await db.q
    .select({ s: samples, output: staging.output })
    .from(samples)
    .leftJoin(staging, eq(staging.sampleId, samples.id))
    .where(range)
    .orderBy(asc(samples.seq));
}

export type UploadedShard = Pick<
  ShardRow,
  | 'key'
  | 'bytes'
  | 'lines'
  | 'sha256'
  | 'errorsKey'
  | 'errorsBytes'
  | 'errorsLines'
  | 'errorsSha256'
  | 'tokensKey'
  | 'tokensBytes'
  | 'tokensRows'
  | 'tokensSha256'
  | 'tokensTrainable'
> & {
  lineOf: { id: number; line: number }[];
  errorCount: number;
};

/** Points samples at their lines in an uploaded shard object. */
async function setOutputLines(tx: DbOrTx, key: string, lineOf: { id: number; line: number }[]): Promise<void> {
  if (lineOf.length === 0) return;
  if (tx.dialect === 'pg') {
    // One statement for the whole shard, not one round trip a sample.
    await tx.exec('update samples as s set output_key = ?, output_line = v.line from unnest(?::bigint[], ?::int[]) as v(id, line) where s.id = v.id', [
      key,
      lineOf.map((l) => l.id),
      lineOf.map((l) => l.line),
    ]);
    return;
  }
  for (const l of lineOf) await tx.exec('update samples set output_key = ?, output_line = ? where id = ?', [key, l.line, l.id]);
}

/**
 * Marks a shard uploaded with what was written, points its samples at their lines, drops its
 * staging rows and records the event, in one transaction. False, changing nothing, when a retry
 * reopened samples of the shard while the upload ran (its generation moved): that upload is stale.
 */
export async function markShardUploaded(db: Db, runId: string, shard: Pick<ShardRow, 'idx' | 'generation'>, up: UploadedShard, now: number): Promise<boolean> {
  const { lineOf, errorCount, ...written } = up;
  const { shards, staging, runs } = db.t;
  return db.tx(async (tx) => {
    const at = and(eq(shards.runId, runId), eq(shards.idx, shard.idx));
    // Locked on PostgreSQL: a retry reopening the shard meanwhile waits for this transaction.
    const [current] = await locked(tx, tx.q.select().from(shards).where(at).limit(1));
    if (!current || current.status !== 'open' || current.generation !== shard.generation || current.terminalCount !== current.sampleCount) {
      return false;
    }
    await tx.q
      .update(shards)
      .set({ status: 'uploaded', ...written, uploadedAt: now, lastError: null, pendingDigests: null })
      .where(at);
    await setOutputLines(tx, up.key!, lineOf);
    await tx.q.delete(staging).where(and(eq(staging.runId, runId), eq(staging.shardIdx, shard.idx)));
    await tx.q
      .update(runs)
      .set({ shardsUploaded: sql`${runs.shardsUploaded} + 1`, updatedAt: now })
      .where(eq(runs.id, runId));
    await appendEvent(tx, runId, 'shard_uploaded', { shard: shard.idx, key: up.key, lines: up.lines, errors: errorCount }, now);
    return true;
  });
}

export async function listRunShards(db: DbOrTx, runId: string): Promise<ShardRow[]> {
  const { shards } = db.t;
  return await db.q.select().from(shards).where(eq(shards.runId, runId)).orderBy(asc(shards.idx));
}

export async function getShard(db: DbOrTx, runId: string, idx: number): Promise<ShardRow | null> {
  const { shards } = db.t;
  const [row] = await db.q
    .select()
    .from(shards)
    .where(and(eq(shards.runId, runId), eq(shards.idx, idx)));
  return row ?? null;
}
