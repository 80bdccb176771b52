import { and, asc, eq, gt, inArray, ne, sql, type SQL } from 'drizzle-orm';
import type { Db, DbOrTx } from './client.js';
import { samples, shards } from './schema.js';
import { flagBit, type Flag } from '../domain/flags.js';

export function getSample(db: Db, runId: string, customId: string) {
  return db.select().from(samples).where(and(eq(samples.runId, runId), eq(samples.customId, customId))).get();
}

/** Samples in input order; `after` is the custom_id that ended the previous page. */
export function listSamples(db: Db, runId: string, opts: { status?: string; flag?: Flag; after?: string; limit: number }) {
  const where: SQL[] = [eq(samples.runId, runId)];
  if (opts.status) where.push(eq(samples.status, opts.status));
  if (opts.flag) where.push(ne(sql`${samples.flags} & ${flagBit(opts.flag)}`, 0));
  if (opts.after) {
    const cursor = getSample(db, runId, opts.after);
    if (cursor) where.push(gt(samples.seq, cursor.seq));
  }
  return db
    .select()
    .from(samples)
    .where(and(...where))
    .orderBy(asc(samples.seq))
    .limit(opts.limit + 1)
    .all();
}

export function listShards(db: Db, runId: string, opts: { after?: number; limit: number }) {
  return db
    .select()
    .from(shards)
    .where(and(eq(shards.runId, runId), gt(shards.idx, opts.after ?? -1)))
    .orderBy(asc(shards.idx))
    .limit(opts.limit + 1)
    .all();
}

/**
 * The ingest loop's insert, prepared once per run: a duplicate custom_id inserts nothing
 * (changes = 0) rather than failing the batch.
 */
export function prepareSampleInsert(db: Db) {
  const insert = db.$client.prepare(
    `insert into samples (run_id, seq, shard_idx, custom_id, status, request) values (?, ?, ?, ?, 'pending', ?)
     on conflict (run_id, custom_id) do nothing`,
  );
  // Positional arguments: this runs once per input line, and an object per call is garbage.
  return (runId: string, seq: number, shardIdx: number, customId: string, request: string): boolean =>
    insert.run(runId, seq, shardIdx, customId, request).changes > 0;
}

/** Drops what an attempt at validating a run inserted: its samples and its shards. */
export function clearRunSamples(db: DbOrTx, runId: string): void {
  db.transaction((tx) => {
    tx.delete(samples).where(eq(samples.runId, runId)).run();
    tx.delete(shards).where(eq(shards.runId, runId)).run();
  });
}

/** The samples a retry puts back in the queue: the failed ones, or the completed ones with a flag. */
export function samplesToRetry(db: DbOrTx, runId: string, only: 'failed' | 'flagged'): { id: number; shardIdx: number; flags: number }[] {
  const which =
    only === 'failed'
      ? and(eq(samples.runId, runId), eq(samples.status, 'failed'))
      : and(eq(samples.runId, runId), eq(samples.status, 'completed'), ne(samples.flags, 0));
  return db.select({ id: samples.id, shardIdx: samples.shardIdx, flags: samples.flags }).from(samples).where(which).all();
}

/** Makes samples pending again with a fresh attempt budget, as if never sent. */
export function requeueSamples(db: DbOrTx, ids: number[]): void {
  db.update(samples)
    .set({
      status: 'pending',
      attempts: 0,
      qualityRetries: 0,
      availableAt: 0,
      errorCode: null,
      errorMessage: null,
      errorStatus: null,
      flags: 0,
      leaseOwner: null,
      leaseExpiresAt: null,
    })
    .where(inArray(samples.id, ids))
    .run();
}
