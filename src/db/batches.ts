import { and, asc, desc, eq, gt, gte, inArray, isNotNull, isNull, lt, lte, or, sql, type SQL } from 'drizzle-orm';
import type { Db, DbOrTx } from './client.js';
import type { RunRow } from './schema.js';

export async function getBatchRun(db: Db, batchId: string): Promise<RunRow | undefined> {
  const { runs } = db.t;
  const [row] = await db.q.select().from(runs).where(eq(runs.batchId, batchId)).limit(1);
  return row;
}

/** Batch runs newest first; `after` is the batch id that ended the previous page. */
export async function listBatchRuns(db: Db, opts: { after?: string; limit: number }): Promise<RunRow[]> {
  const { runs } = db.t;
  const where: SQL[] = [isNotNull(runs.batchId)];
  if (opts.after) where.push(lt(runs.batchId, opts.after));
  return await db.q
    .select()
    .from(runs)
    .where(and(...where))
    .orderBy(desc(runs.batchId))
    .limit(opts.limit + 1);
}

/** The run whose batch output or error file has this id. */
export async function getRunByBatchFile(db: Db, fileId: string): Promise<RunRow | undefined> {
  const { runs } = db.t;
  const [row] = await db.q
    .select()
    .from(runs)
    .where(or(eq(runs.outputFileId, fileId), eq(runs.errorFileId, fileId)))
    .limit(1);
  return row;
}

export interface StatusTimes {
  /** First time the run entered each status. */
  first: Map<string, number>;
  /** Last time the run entered each status. */
  last: Map<string, number>;
}

/** When each of these runs entered each status, from the events table, in one query. */
export async function statusTimes(db: Db, runIds: string[]): Promise<Map<string, StatusTimes>> {
  const out = new Map<string, StatusTimes>();
  if (runIds.length === 0) return out;
  const { events } = db.t;
  const status = db.dialect === 'pg' ? sql<string>`${events.data}->>'status'` : sql<string>`json_extract(${events.data}, '$.status')`;
  const rows = await db.q
    .select({
      runId: events.runId,
      status,
      first: sql<number>`min(${events.createdAt})`.mapWith(Number),
      last: sql<number>`max(${events.createdAt})`.mapWith(Number),
    })
    .from(events)
    .where(and(inArray(events.runId, runIds), eq(events.type, 'status')))
    .groupBy(events.runId, status);
  for (const r of rows) {
    let t = out.get(r.runId);
    if (!t) out.set(r.runId, (t = { first: new Map(), last: new Map() }));
    t.first.set(r.status, r.first);
    t.last.set(r.status, r.last);
  }
  return out;
}

/** A run's shards in order, a page at a time. */
export async function shardPage(db: Db, runId: string, afterIdx: number, limit: number) {
  const { shards } = db.t;
  return await db.q
    .select()
    .from(shards)
    .where(and(eq(shards.runId, runId), gt(shards.idx, afterIdx)))
    .orderBy(asc(shards.idx))
    .limit(limit);
}

/** The cancelled samples of one shard, in input order: never answered, so in no shard object. */
export async function cancelledSamples(db: Db, runId: string, shard: { firstSeq: number; sampleCount: number }): Promise<{ customId: string }[]> {
  // A seq range, not shard_idx: it walks the (run, status, seq) index however many samples were cancelled.
  const { samples } = db.t;
  return await db.q
    .select({ customId: samples.customId })
    .from(samples)
    .where(
      and(eq(samples.runId, runId), eq(samples.status, 'cancelled'), gte(samples.seq, shard.firstSeq), lt(samples.seq, shard.firstSeq + shard.sampleCount)),
    )
    .orderBy(asc(samples.seq));
}

/** Batch runs past their completion window with unanswered samples left to give up. */
export async function dueBatchRuns(db: Db, now: number): Promise<RunRow[]> {
  const { runs } = db.t;
  return await db.q
    .select()
    .from(runs)
    .where(
      and(isNotNull(runs.batchId), isNull(runs.expiredAt), lte(runs.expiresAt, now), inArray(runs.status, ['validating', 'queued', 'in_progress', 'paused'])),
    );
}

/** Remembers a batch file's size, unless the run finished again (a retry) since `finishedAt`. */
export async function setBatchFileBytes(db: DbOrTx, runId: string, finishedAt: number, bytes: NonNullable<RunRow['batchFileBytes']>): Promise<void> {
  const { runs } = db.t;
  await db.write((w) =>
    w.q
      .update(runs)
      .set({ batchFileBytes: bytes })
      .where(and(eq(runs.id, runId), eq(runs.finishedAt, finishedAt))),
  );
}
