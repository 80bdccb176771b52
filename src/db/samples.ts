import { and, asc, eq, gt, ne, sql, type SQL } from 'drizzle-orm';
import type { Db } from './client.js';
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
