import { and, asc, eq, gt, inArray, ne, sql, type SQL } from 'drizzle-orm';
import { type Db, type DbOrTx, IMMEDIATE } from './client.js';
import { runs, samples, shards } from './schema.js';
import { flagBit, type Flag } from '../domain/flags.js';

export async function getSample(db: Db, runId: string, customId: string) {
  const [row] = await db
    .select()
    .from(samples)
    .where(and(eq(samples.runId, runId), eq(samples.customId, customId)))
    .limit(1);
  return row;
}

/** Samples in input order; `after` is the custom_id that ended the previous page. */
export async function listSamples(db: Db, runId: string, opts: { status?: string; flag?: Flag; after?: string; limit: number }) {
  const where: SQL[] = [eq(samples.runId, runId)];
  if (opts.status) where.push(eq(samples.status, opts.status));
  if (opts.flag) where.push(ne(sql`${samples.flags} & ${flagBit(opts.flag)}`, 0));
  if (opts.after) {
    const cursor = await getSample(db, runId, opts.after);
    if (cursor) where.push(gt(samples.seq, cursor.seq));
  }
  return await db
    .select()
    .from(samples)
    .where(and(...where))
    .orderBy(asc(samples.seq))
    .limit(opts.limit + 1);
}

export async function listShards(db: Db, runId: string, opts: { after?: number; limit: number }) {
  return await db
    .select()
    .from(shards)
    .where(and(eq(shards.runId, runId), gt(shards.idx, opts.after ?? -1)))
    .orderBy(asc(shards.idx))
    .limit(opts.limit + 1);
}

// ---- leases (the runner) ----

/**
 * What a lease given back without an answer does to its sample: pending again, with the attempt it
 * was charged on claim refunded (shutdown, a crash, a sick endpoint: not the sample's fault).
 */
export const RELEASE_LEASE = `status = 'pending', attempts = max(attempts - 1, 0), lease_owner = null, lease_expires_at = null`;

/** A sample leased for dispatch. */
export interface ClaimedRow {
  id: number;
  shardIdx: number;
  request: string;
  attempts: number;
  qualityRetries: number;
  serverFaults: number;
}

/**
 * The slice is claimed in a scrambled order (Knuth's multiplicative hash of the position), not in
 * input order: the part of it answered so far is then a random sample of the input too, where in
 * input order the first answers of an input sorted short to long would all be short.
 */
const SLICE_SHUFFLE = 2654435761;

const byId = (a: ClaimedRow, b: ClaimedRow) => a.id - b.id;
const LEASE = `update samples set status = 'in_progress', attempts = attempts + 1, lease_owner = ?, lease_expires_at = ?`;
const LEASED = `returning id, shard_idx as shardIdx, request, attempts, quality_retries as qualityRetries, server_faults as serverFaults`;

/**
 * The order a claim takes a run's samples in, after its calibration slice: `slice_only` (a dry
 * run: nothing else), `input`, or `length_aware`: within a window of pending samples from the
 * oldest one on, the longest predicted first (samples without a prediction last), so the longest
 * start early and the run ends flat, while no sample runs more than the window ahead of the oldest
 * open one and shards still close in order.
 */
export type ClaimOrder = 'slice_only' | 'input' | 'length_aware';

/**
 * Prepares the claim: leases up to `limit` pending samples of a run that are due, the calibration
 * slice first (samples_calibration_idx), then the rest in the run's `ClaimOrder`, charging each an
 * attempt, and moves the run's counters with them in the same transaction, so a crash between the
 * statements cannot leave the counters off by a batch.
 */
export function prepareClaim(
  db: Db,
): (runId: string, owner: string, now: number, leaseExpiresAt: number, limit: number, order: ClaimOrder, window: number) => ClaimedRow[] {
  const claimSlice = db.$client.prepare(
    // INDEXED BY: without statistics the planner takes samples_claim_idx and reads every pending
    // sample of the run on every claim; the partial index holds the slice alone.
    `${LEASE} where id in (select id from samples indexed by samples_calibration_idx where run_id = ? and calibration = 1 and status = 'pending' and available_at <= ?
       order by (seq * ${SLICE_SHUFFLE}) % 4294967296 limit ?) ${LEASED}`,
  );
  const claimInOrder = db.$client.prepare(
    `${LEASE} where id in (select id from samples where run_id = ? and status = 'pending' and available_at <= ? order by seq limit ?) ${LEASED}`,
  );
  // The window is a range of the claim index (run_id, status, seq): at most `window` rows sorted per claim.
  const claimLongest = db.$client.prepare(
    `${LEASE} where id in (select id from samples where run_id = ? and status = 'pending' and available_at <= ?
       and seq < (select min(seq) from samples where run_id = ? and status = 'pending') + ?
       order by coalesce(predicted_tokens, -1) desc, seq limit ?) ${LEASED}`,
  );
  const count = db.$client.prepare(`update runs set pending = pending - ?, in_progress = in_progress + ? where id = ?`);
  return db.$client.transaction((runId: string, owner: string, now: number, leaseExpiresAt: number, limit: number, order: ClaimOrder, window: number) => {
    // `returning` gives no order: each part is put back in input order (ids follow it).
    const rows = (claimSlice.all(owner, leaseExpiresAt, runId, now, limit) as ClaimedRow[]).sort(byId);
    const left = limit - rows.length;
    if (left > 0 && order === 'input') rows.push(...(claimInOrder.all(owner, leaseExpiresAt, runId, now, left) as ClaimedRow[]).sort(byId));
    if (left > 0 && order === 'length_aware')
      rows.push(...(claimLongest.all(owner, leaseExpiresAt, runId, now, runId, window, left) as ClaimedRow[]).sort(byId));
    if (rows.length) count.run(rows.length, rows.length, runId);
    return rows;
  });
}

/** Marks a run's calibration slice by input position. */
export function markCalibration(db: DbOrTx, runId: string, seqs: readonly number[]): void {
  for (const seq of seqs) {
    db.update(samples)
      .set({ calibration: true })
      .where(and(eq(samples.runId, runId), eq(samples.seq, seq)))
      .run();
  }
}

/** A calibration answer: its input position, completion tokens, latency and the endpoint that gave it. */
export type SliceAnswer = [seq: number, tokens: number, latencyMs: number, endpointId: string];

/** The calibration slice's answers in input order, and how many of it are not terminal yet. */
export function calibrationAnswers(db: Db, runId: string): { answered: SliceAnswer[]; open: number } {
  // INDEXED BY, and sorted here: to skip a sort of the slice's few hundred rows, the planner walks
  // samples_run_seq_idx through the whole run (2.6 s a read on a 10M-sample run, every forecast
  // while the slice is open, and at every start).
  const rows = (
    db.$client
      .prepare(
        `select seq, status, completion_tokens, latency_ms, endpoint_id from samples indexed by samples_calibration_idx where run_id = ? and calibration = 1`,
      )
      .raw()
      .all(runId) as [number, string, number | null, number | null, string | null][]
  ).sort((a, b) => a[0] - b[0]);
  const answered: SliceAnswer[] = [];
  let open = 0;
  for (const [seq, status, tokens, latency, endpointId] of rows) {
    if (status === 'completed' && tokens !== null) answered.push([seq, tokens, latency ?? 0, endpointId ?? '']);
    else if (status === 'pending' || status === 'in_progress') open++;
  }
  return { answered, open };
}

/**
 * The furthest input position dispatched outside the slice, or -1: samples are claimed in input
 * order, so everything beyond it is still to do. Each status is one walk down the claim index from
 * its end, past at most the slice's own rows.
 */
export function dispatchFrontier(db: Db, runId: string): number {
  const stmt = db.$client.prepare(`select seq from samples where run_id = ? and status = ? and calibration = 0 order by seq desc limit 1`).pluck();
  let frontier = -1;
  for (const status of ['in_progress', 'completed', 'failed'] as const) {
    const seq = stmt.get(runId, status) as number | undefined;
    if (seq !== undefined && seq > frontier) frontier = seq;
  }
  return frontier;
}

/** Gives back every lease of a run, whoever held it (a restart, with the only dispatcher gone); returns how many. */
export function releaseRunLeases(db: Db, runId: string): number {
  return db.$client.transaction(() => {
    const n = db.$client.prepare(`update samples set ${RELEASE_LEASE} where run_id = ? and status = 'in_progress'`).run(runId).changes;
    if (n) db.$client.prepare(`update runs set pending = pending + ?, in_progress = in_progress - ? where id = ?`).run(n, n, runId);
    return n;
  })();
}

/** Cancels a run's pending samples, moving its shards' and its own counters with them. */
export function cancelPendingSamples(db: Db, runId: string): void {
  db.transaction((tx) => {
    const perShard = tx
      .select({ idx: samples.shardIdx, n: sql<number>`count(*)` })
      .from(samples)
      .where(and(eq(samples.runId, runId), eq(samples.status, 'pending')))
      .groupBy(samples.shardIdx)
      .all();
    if (!perShard.length) return;
    const n = tx
      .update(samples)
      .set({ status: 'cancelled' })
      .where(and(eq(samples.runId, runId), eq(samples.status, 'pending')))
      .run().changes;
    for (const s of perShard) {
      tx.update(shards)
        .set({ terminalCount: sql`${shards.terminalCount} + ${s.n}` })
        .where(and(eq(shards.runId, runId), eq(shards.idx, s.idx)))
        .run();
    }
    tx.update(runs)
      .set({ pending: sql`${runs.pending} - ${n}`, cancelled: sql`${runs.cancelled} + ${n}` })
      .where(eq(runs.id, runId))
      .run();
  }, IMMEDIATE);
}

/**
 * The ingest loop's insert, prepared once per run: a duplicate custom_id inserts nothing
 * (changes = 0) rather than failing the batch.
 */
export function prepareSampleInsert(db: Db) {
  const insert = db.$client.prepare(
    `insert into samples (run_id, seq, shard_idx, custom_id, status, request, predicted_tokens) values (?, ?, ?, ?, 'pending', ?, ?)
     on conflict (run_id, custom_id) do nothing`,
  );
  // Positional arguments: this runs once per input line, and an object per call is garbage.
  return (runId: string, seq: number, shardIdx: number, customId: string, request: string, predictedTokens: number | null): boolean =>
    insert.run(runId, seq, shardIdx, customId, request, predictedTokens).changes > 0;
}

/** Drops what an attempt at validating a run inserted: its samples and its shards. */
export function clearRunSamples(db: DbOrTx, runId: string): void {
  db.transaction((tx) => {
    tx.delete(samples).where(eq(samples.runId, runId)).run();
    tx.delete(shards).where(eq(shards.runId, runId)).run();
  });
}

/** The samples a retry puts back in the queue: the failed ones, or the completed ones with a flag. */
export function samplesToRetry(db: DbOrTx, runId: string, only: 'failed' | 'flagged', endpointId?: string): { id: number; shardIdx: number; flags: number }[] {
  const which = and(
    eq(samples.runId, runId),
    only === 'failed' ? eq(samples.status, 'failed') : and(eq(samples.status, 'completed'), ne(samples.flags, 0)),
    endpointId === undefined ? undefined : eq(samples.endpointId, endpointId),
  );
  return db.select({ id: samples.id, shardIdx: samples.shardIdx, flags: samples.flags }).from(samples).where(which).all();
}

/** Makes samples pending again with a fresh attempt budget, as if never sent. */
export function requeueSamples(db: DbOrTx, ids: number[]): void {
  db.update(samples)
    .set({
      status: 'pending',
      attempts: 0,
      serverFaults: 0,
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

/**
 * A run's latest completed samples, newest first: what the quality window held before a restart.
 * Samples are sent in input order, so the last ones in input order are the latest; the (run_id,
 * seq) index serves that walk, where ordering by completed_at would read the whole run.
 */
export function recentCompleted(db: DbOrTx, runId: string, limit: number): { flags: number; endpointId: string | null }[] {
  return db
    .select({ flags: samples.flags, endpointId: samples.endpointId })
    .from(samples)
    .where(and(eq(samples.runId, runId), eq(samples.status, 'completed')))
    .orderBy(sql`${samples.seq} desc`)
    .limit(limit)
    .all();
}

/** How many completed samples of a run have each completion length: (tokens, samples) pairs, from samples_completion_tokens_idx. */
export function completionLengthCounts(db: Db, runId: string): [number, number][] {
  return db.$client
    .prepare(
      `select completion_tokens, count(*) from samples where run_id = ? and status = 'completed' and completion_tokens is not null group by completion_tokens`,
    )
    .raw()
    .all(runId) as [number, number][];
}
