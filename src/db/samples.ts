import { and, asc, desc, eq, gt, inArray, ne, sql, type SQL } from 'drizzle-orm';
import { type Db, type DbOrTx, locked, sqliteClient } from './client.js';
import { deleteRunVariants } from './run-variants.js';
import { flagBit, type Flag } from '../domain/flags.js';
import { isDispatchable } from '../domain/statuses.js';
import type { TurnRecord } from '../domain/conversation.js';
import { turnsBefore } from './sample-turns.js';

/** One sample of a run: the answer `sampleIndex` (0 by default, the only one when the run asks one answer a line) to the line `customId`. */
export async function getSample(db: Db, runId: string, customId: string, sampleIndex = 0) {
  const { samples } = db.t;
  const [row] = await db.q
    .select()
    .from(samples)
    .where(and(eq(samples.runId, runId), eq(samples.customId, customId), eq(samples.sampleIndex, sampleIndex)))
    .limit(1);
  return row;
}

/** The last input position of a line's samples (its n answers are consecutive), or undefined when the run has no such line. */
async function lastSeqOf(db: Db, runId: string, customId: string): Promise<number | undefined> {
  const { samples } = db.t;
  const [row] = await db.q
    .select({ seq: samples.seq })
    .from(samples)
    .where(and(eq(samples.runId, runId), eq(samples.customId, customId)))
    .orderBy(desc(samples.sampleIndex))
    .limit(1);
  return row?.seq;
}

/**
 * Samples in input order; `after` is the custom_id that ended the previous page. Pages hold whole
 * lines: with params.n > 1, a page that would end inside a line's answers takes the rest of them
 * too, so a cursor by custom_id never skips one. Returns the rows and the page's length (`limit`,
 * or more when a line was completed); a row past it says there is more.
 */
export async function listSamples(db: Db, runId: string, opts: { status?: string; flag?: Flag; after?: string; limit: number }) {
  const { samples } = db.t;
  const where: SQL[] = [eq(samples.runId, runId)];
  if (opts.status) where.push(eq(samples.status, opts.status));
  // The bit as a literal, as in the partial index samples_flag_<flag>_idx, so the index matches on
  // PostgreSQL's generic plans too.
  if (opts.flag) where.push(ne(sql`${samples.flags} & ${sql.raw(String(flagBit(opts.flag)))}`, 0));
  if (opts.after) {
    const cursor = await lastSeqOf(db, runId, opts.after);
    if (cursor !== undefined) where.push(gt(samples.seq, cursor));
  }
  const rows = await db.q
    .select()
    .from(samples)
    .where(and(...where))
    .orderBy(asc(samples.seq))
    .limit(opts.limit + 1);
  const last = rows[opts.limit - 1];
  if (!last || rows[opts.limit]?.customId !== last.customId) return { rows, limit: opts.limit };
  // The page ends inside a line: the rest of its answers join it, then one row past them.
  const rest = await db.q
    .select()
    .from(samples)
    .where(and(...where, eq(samples.customId, last.customId), gt(samples.seq, last.seq)))
    .orderBy(asc(samples.seq));
  const limit = opts.limit + rest.length;
  const next = await db.q
    .select()
    .from(samples)
    .where(and(...where, gt(samples.seq, rest[rest.length - 1].seq)))
    .orderBy(asc(samples.seq))
    .limit(1);
  return { rows: [...rows.slice(0, opts.limit), ...rest, ...next], limit };
}

export async function listShards(db: Db, runId: string, opts: { after?: number; limit: number }) {
  const { shards } = db.t;
  return await db.q
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
export const RELEASE_LEASE = `status = 'pending', attempts = case when attempts > 0 then attempts - 1 else 0 end, lease_owner = null, lease_expires_at = null`;

/** A sample leased for dispatch. */
export interface ClaimedRow {
  id: number;
  shardIdx: number;
  customId: string;
  /** Which of its line's params.n answers: the answers of one line left pending are sent as one request. */
  sampleIndex: number;
  request: string;
  attempts: number;
  qualityRetries: number;
  serverFaults: number;
  /** The index of its run's variant, or null. */
  variant: number | null;
  /** The max_tokens an on_length "retry" raised it to, or null. */
  maxTokens: number | null;
  /** A conversation's turn to ask (0-based); null for a single request. */
  turn: number | null;
  /** The endpoint whose prefix cache holds the prompt (a conversation's previous turn answered there), or null: dispatch sends it there first. */
  affinityEndpointId: string | null;
  /** A conversation's answered turns before `turn`: the history it is asked with. */
  history?: TurnRecord[];
}

/**
 * The slice is claimed in a scrambled order (Knuth's multiplicative hash of the position), not in
 * input order: the part of it answered so far is then a random sample of the input too, where in
 * input order the first answers of an input sorted short to long would all be short.
 */
const SLICE_SHUFFLE = 2654435761;

const byId = (a: ClaimedRow, b: ClaimedRow) => a.id - b.id;
const LEASE = `update samples set status = 'in_progress', attempts = attempts + 1, lease_owner = ?, lease_expires_at = ?`;
// Quoted aliases: PostgreSQL folds unquoted names to lower case.
const CLAIMED_COLUMNS = `id, shard_idx as "shardIdx", custom_id as "customId", sample_index as "sampleIndex", request, attempts, quality_retries as "qualityRetries",
  server_faults as "serverFaults", variant, max_tokens as "maxTokens", turn, affinity_endpoint_id as "affinityEndpointId"`;
const LEASED = `returning ${CLAIMED_COLUMNS}`;

/**
 * The order a claim takes a run's samples in, after its calibration slice: `slice_only` (a dry
 * run: nothing else), `input`, or `length_aware`: within a window of pending samples from the
 * oldest one on, the longest predicted first (samples without a prediction last), so the longest
 * start early and the run ends flat, while no sample runs more than the window ahead of the oldest
 * open one and shards still close in order.
 */
export type ClaimOrder = 'slice_only' | 'input' | 'length_aware';

/**
 * The claim statements of each dialect. On SQLite the transaction holds the database; INDEXED BY:
 * without statistics the planner takes samples_claim_idx and reads every pending sample of the run
 * on every claim, where the partial index holds the slice alone. On PostgreSQL, SKIP LOCKED lets
 * claims of several replicas run side by side without waiting for or taking each other's rows,
 * and the outer `status = 'pending'` keeps a row another claim took meanwhile from being leased twice.
 * There the picked ids are an array, computed once: as `id in (select … limit ? for update skip
 * locked)`, the planner may rescan the subquery for every row it updates (a nested-loop semi-join,
 * the plan it picks for a run loaded since its last ANALYZE), and each rescan skips the rows the
 * last one leased and picks the next ones: a claim of 2 leased all 6 samples of a test run, and
 * would read the run's pending samples once per row it leased.
 */
function claimSql(db: Db, mine: boolean) {
  const pg = db.dialect === 'pg';
  const skip = pg ? 'for update skip locked' : '';
  const [pick, picked] = pg ? ['where id = any(array(', '))'] : ['where id in (', ')'];
  const still = pg ? `and status = 'pending'` : '';
  const slice = pg ? 'samples' : 'samples indexed by samples_calibration_idx';
  const inSlice = pg ? 'calibration' : 'calibration = 1';
  const underway = pg ? 'samples' : 'samples indexed by samples_underway_idx';
  // PostgreSQL, a replica of several: none of the samples whose prefix is cached on a ready
  // endpoint another replica drives (the endpoints driven here bound right after the due time).
  // One that is down, draining or quarantined holds nothing back, as in pickForSlot.
  const ours = mine
    ? `and (affinity_endpoint_id is null or affinity_endpoint_id = any(?)
       or not exists (select 1 from endpoints where endpoints.id = samples.affinity_endpoint_id and endpoints.state = 'ready'))`
    : '';
  return {
    // Conversations waiting for their next turn (samples_underway_idx holds only those).
    underway: `${LEASE} ${pick}select id from ${underway} where run_id = ? and status = 'pending' and turn > 0 and available_at <= ? ${ours}
       order by seq limit ? ${skip}${picked} ${still} ${LEASED}`,
    slice: `${LEASE} ${pick}select id from ${slice} where run_id = ? and ${inSlice} and status = 'pending' and available_at <= ? ${ours}
       order by (seq * ${SLICE_SHUFFLE}) % 4294967296 limit ? ${skip}${picked} ${still} ${LEASED}`,
    inOrder: `${LEASE} ${pick}select id from samples where run_id = ? and status = 'pending' and available_at <= ? ${ours} order by seq limit ? ${skip}${picked} ${still} ${LEASED}`,
    // The window is a range of the claim index (run_id, status, seq): at most `window` rows sorted per claim.
    longest: `${LEASE} ${pick}select id from samples where run_id = ? and status = 'pending' and available_at <= ? ${ours}
       and seq < (select min(seq) from samples where run_id = ? and status = 'pending') + ?
       order by coalesce(predicted_tokens, -1) desc, seq limit ? ${skip}${picked} ${still} ${LEASED}`,
    // The pending answers of the lines just claimed that the claim left behind (params.n > 1): by the (run_id, custom_id, sample_index) index.
    siblings: `${LEASE} ${pick}select id from samples where run_id = ? and custom_id ${pg ? '= any(?)' : 'in (select value from json_each(?))'}
       and status = 'pending' and available_at <= ? ${skip}${picked} ${still} ${LEASED}`,
  };
}

/**
 * Leases up to `limit` pending samples of a run that are due, the conversations under way first
 * (so their shards close and their prefixes stay cached), then the calibration slice
 * (samples_calibration_idx), then the rest in the run's `ClaimOrder`, charging each an attempt,
 * and moves the run's counters with them in the same transaction, so a crash between the
 * statements cannot leave the counters off by a batch. With `groups`, the due pending answers of
 * every line claimed join the claim (past `limit`), so a line's answers go out as one request.
 *
 * A replica of several (`drives`) leaves alone the samples whose prefix is cached on a ready
 * endpoint another replica drives: a conversation's next turn is that replica's to send, to the
 * server that holds its prefix. Only when nothing else is due does it take those that have been
 * due since `movesAfter` (the affinity wait): the driver is busier than its peers, and the turn
 * moves, as a turn held for a busy endpoint of one process does (runner/endpoint-choice.ts).
 */
export async function claimSamples(
  db: Db,
  c: {
    runId: string;
    owner: string;
    now: number;
    leaseExpiresAt: number;
    limit: number;
    order: ClaimOrder;
    window: number;
    /** The run asks several answers a line (params.n > 1): a line's pending answers are claimed together. */
    groups?: boolean;
    /** The endpoints the claimer drives, when it drives only some (a replica of several), else null. */
    drives?: readonly string[] | null;
    /** With `drives`: a sample held for another replica's endpoint may move once due since this time. */
    movesAfter?: number;
  },
  /** PostgreSQL: told the claim's transaction id, for claimStatus should the commit's answer be lost. */
  began?: (xid: string) => void,
): Promise<ClaimedRow[]> {
  const mine = db.dialect === 'pg' && c.drives != null;
  const q = claimSql(db, mine);
  return db.tx(async (tx) => {
    // PostgreSQL: only a live replica claims. One taken for dead since its last heartbeat (its row
    // removed) takes nothing more; the row is key-share locked, so its removal waits for this
    // claim, and the leases it made are then returned with the rest (src/db/replicas.ts). A
    // heartbeat's update does not wait on it.
    if (tx.dialect === 'pg') {
      const { rows: holder } = await tx.exec<{ xid: string }>('select txid_current()::text as xid from replicas where owner = ? for key share', [c.owner]);
      if (!holder.length) throw new Error('this replica was taken for dead: it claims nothing more');
      began?.(holder[0].xid);
    }
    // A run paused or cancelled since the caller read it takes no more: the status is read in the
    // claim's own transaction.
    const { rows: run } = await tx.exec<{ status: string; regenerate: string | null }>('select status, regenerate from runs where id = ?', [c.runId]);
    if (!run.length || !isDispatchable(run[0].status)) return [];
    const due = (at: number): unknown[] => (mine ? [c.runId, at, [...c.drives!]] : [c.runId, at]);
    const lease = [c.owner, c.leaseExpiresAt];
    // `returning` gives no order: each part is put back in input order (ids follow it).
    const rows = run[0].regenerate !== 'all_assistant' ? [] : (await tx.exec<ClaimedRow>(q.underway, [...lease, ...due(c.now), c.limit])).rows.sort(byId);
    if (rows.length < c.limit) rows.push(...(await tx.exec<ClaimedRow>(q.slice, [...lease, ...due(c.now), c.limit - rows.length])).rows.sort(byId));
    const left = c.limit - rows.length;
    if (left > 0 && c.order === 'input') rows.push(...(await tx.exec<ClaimedRow>(q.inOrder, [...lease, ...due(c.now), left])).rows.sort(byId));
    if (left > 0 && c.order === 'length_aware') {
      const longest = await tx.exec<ClaimedRow>(q.longest, [...lease, ...due(c.now), c.runId, c.window, left]);
      rows.push(...longest.rows.sort(byId));
    }
    // Nothing else due: the samples held elsewhere that have waited their driver out.
    if (mine && rows.length === 0 && c.order !== 'slice_only' && c.movesAfter !== undefined) {
      const moving = claimSql(db, false).inOrder;
      rows.push(...(await tx.exec<ClaimedRow>(moving, [...lease, c.runId, c.movesAfter, left])).rows.sort(byId));
    }
    if (c.groups && rows.length) {
      const lines = [...new Set(rows.map((r) => r.customId))];
      const more = await tx.exec<ClaimedRow>(q.siblings, [...lease, c.runId, tx.dialect === 'pg' ? lines : JSON.stringify(lines), c.now]);
      rows.push(...more.rows.sort(byId));
    }
    if (rows.length) await tx.exec(`update runs set pending = pending - ?, in_progress = in_progress + ? where id = ?`, [rows.length, rows.length, c.runId]);
    return await withHistory(tx, rows);
  });
}

/** Each conversation under way given the turns it has answered: its next turn is asked with them. */
async function withHistory(db: DbOrTx, rows: ClaimedRow[]): Promise<ClaimedRow[]> {
  const underway = rows.filter((r): r is ClaimedRow & { turn: number } => r.turn !== null && r.turn > 0);
  if (!underway.length) return rows;
  const turns = await turnsBefore(db, underway);
  for (const r of underway) r.history = turns.get(r.id) ?? [];
  return rows;
}

/**
 * The samples a claim leased, read again: each claim's lease expiry is unique for its owner and so
 * names the claim. A claim whose commit was made but whose answer was lost (the connection cut at
 * the commit) is found here, where it would otherwise stay leased until a restart; a claim that
 * was not made finds nothing. The slice first, then in input order (a claim puts conversations
 * under way first; read again, they come in input order with the rest: only the order differs).
 */
export async function readClaim(db: Db, c: { runId: string; owner: string; leaseExpiresAt: number }): Promise<ClaimedRow[]> {
  const from = db.dialect === 'pg' ? 'samples' : 'samples indexed by samples_claim_idx';
  const { rows } = await db.exec<ClaimedRow>(
    `select ${CLAIMED_COLUMNS} from ${from}
     where run_id = ? and status = 'in_progress' and lease_owner = ? and lease_expires_at = ? order by calibration desc, seq`,
    [c.runId, c.owner, c.leaseExpiresAt],
  );
  return await withHistory(db, rows);
}

/**
 * PostgreSQL: where a claim's transaction stands, by the id claimSamples was told: `committed`,
 * `aborted`, or `in progress` while its commit is still being made; null once it is too old to say.
 */
async function claimStatus(db: Db, xid: string): Promise<string | null> {
  const { rows } = await db.exec<{ status: string | null }>('select txid_status(?::bigint) as status', [xid]);
  return rows[0]?.status ?? null;
}

/**
 * A claim that failed as its caller saw it, read again: its samples if it was made, none if it was
 * not, null while it may still be. On PostgreSQL a commit cut off from its client may be made
 * after the client saw the error (the server still writing it, or waiting on a synchronous
 * standby): the transaction's status, by the `xid` claimSamples told, says when it is over;
 * without an xid the claim never heard back from its first statement, so it sent no commit. On
 * SQLite a claim that failed was not made, and the read finds nothing.
 */
export async function rereadClaim(db: Db, c: { runId: string; owner: string; leaseExpiresAt: number; xid: string | null }): Promise<ClaimedRow[] | null> {
  if (db.dialect === 'pg') {
    if (c.xid === null) return [];
    const status = await claimStatus(db, c.xid);
    if (status === 'aborted') return [];
    if (status === 'in progress') return null;
  }
  return readClaim(db, c);
}

// Positions per statement: an `in (...)` list binds one value per position, and SQLite caps bound values.
const SEQS_PER_STATEMENT = 500;

/** Marks a run's calibration slice by input position. */
export async function markCalibration(db: DbOrTx, runId: string, seqs: readonly number[]): Promise<void> {
  const { samples } = db.t;
  await db.tx(async (tx) => {
    for (let i = 0; i < seqs.length; i += SEQS_PER_STATEMENT) {
      await tx.q
        .update(samples)
        .set({ calibration: true })
        .where(and(eq(samples.runId, runId), inArray(samples.seq, seqs.slice(i, i + SEQS_PER_STATEMENT))));
    }
  });
}

/** A run's calibration slice, as the FROM and WHERE of a statement with the run id its one parameter (its own index named on SQLite). */
export function sliceFrom(dialect: Db['dialect']): string {
  return dialect === 'pg' ? 'samples where run_id = ? and calibration' : 'samples indexed by samples_calibration_idx where run_id = ? and calibration = 1';
}

/** A calibration answer: its input position, completion tokens, latency and the endpoint that gave it. */
export type SliceAnswer = [seq: number, tokens: number, latencyMs: number, endpointId: string, variant: number | null];

/** The calibration slice's answers in input order, and how many of it are not terminal yet. */
export async function calibrationAnswers(db: Db, runId: string): Promise<{ answered: SliceAnswer[]; open: number }> {
  // INDEXED BY on SQLite, and sorted here: to skip a sort of the slice's few hundred rows, the
  // planner walks samples_run_seq_idx through the whole run (2.6 s a read on a 10M-sample run,
  // every forecast while the slice is open, and at every start).
  const from = sliceFrom(db.dialect);
  const { rows } = await db.exec<{
    seq: number;
    status: string;
    completion_tokens: number | null;
    latency_ms: number | null;
    endpoint_id: string | null;
    variant: number | null;
  }>(`select seq, status, completion_tokens, latency_ms, endpoint_id, variant from ${from}`, [runId]);
  rows.sort((a, b) => a.seq - b.seq);
  const answered: SliceAnswer[] = [];
  let open = 0;
  for (const r of rows) {
    if (r.status === 'completed' && r.completion_tokens !== null)
      answered.push([r.seq, r.completion_tokens, r.latency_ms ?? 0, r.endpoint_id ?? '', r.variant === null ? null : Number(r.variant)]);
    else if (r.status === 'pending' || r.status === 'in_progress') open++;
  }
  return { answered, open };
}

/**
 * The furthest input position dispatched outside the slice, or -1: samples are claimed in input
 * order, so everything beyond it is still to do. Each status is one walk down the claim index from
 * its end, past at most the slice's own rows.
 */
export async function dispatchFrontier(db: Db, runId: string): Promise<number> {
  const outside = db.dialect === 'pg' ? 'not calibration' : 'calibration = 0';
  let frontier = -1;
  for (const status of ['in_progress', 'completed', 'failed'] as const) {
    const { rows } = await db.exec<{ seq: number }>(`select seq from samples where run_id = ? and status = ? and ${outside} order by seq desc limit 1`, [
      runId,
      status,
    ]);
    if (rows.length && rows[0].seq > frontier) frontier = rows[0].seq;
  }
  return frontier;
}

/** Gives back every lease of a run, whoever held it (a restart, with the only dispatcher gone); returns how many. */
export async function releaseRunLeases(db: Db, runId: string): Promise<number> {
  return db.tx(async (tx) => {
    const { changes: n } = await tx.exec(`update samples set ${RELEASE_LEASE} where run_id = ? and status = 'in_progress'`, [runId]);
    if (n) await tx.exec(`update runs set pending = pending + ?, in_progress = in_progress - ? where id = ?`, [n, n, runId]);
    return n;
  });
}

/**
 * PostgreSQL: returns to the queue the leases of a run held by processes that are no longer
 * replicas (they died, or stopped with a claim whose answer was lost), as releaseRunLeases does
 * for all of them. The owners are read before the replicas: a replica registers before it claims,
 * so an owner seen here and missing there is gone, never one that has only just started.
 */
export async function releaseOrphanLeases(db: Db, runId: string): Promise<number> {
  const owners = (
    await db.exec<{ owner: string | null }>(`select distinct lease_owner as owner from samples where run_id = ? and status = 'in_progress'`, [runId])
  ).rows.map((r) => r.owner);
  if (!owners.length) return 0;
  const live = new Set((await db.exec<{ owner: string }>('select owner from replicas')).rows.map((r) => r.owner));
  const gone = owners.filter((o): o is string => o !== null && !live.has(o));
  if (!gone.length) return 0;
  return db.tx(async (tx) => {
    const { changes: n } = await tx.exec(`update samples set ${RELEASE_LEASE} where run_id = ? and status = 'in_progress' and lease_owner = any(?)`, [
      runId,
      gone,
    ]);
    if (n) await tx.exec(`update runs set pending = pending + ?, in_progress = in_progress - ? where id = ?`, [n, n, runId]);
    return n;
  });
}

/** Cancels a run's pending samples, moving its shards' and its own counters with them. */
export async function cancelPendingSamples(db: Db, runId: string): Promise<void> {
  const { shards, runs } = db.t;
  await db.tx(async (tx) => {
    let perShard: { idx: number; n: number | string }[];
    if (tx.dialect === 'pg') {
      // Counted from the rows the update changed: a claim of another replica may take some meanwhile.
      perShard = (
        await tx.exec<{ idx: number; n: string }>(
          `with c as (update samples set status = 'cancelled' where run_id = ? and status = 'pending' returning shard_idx)
           select shard_idx as idx, count(*) as n from c group by shard_idx`,
          [runId],
        )
      ).rows;
    } else {
      // The transaction holds the database: the count and the update see the same rows.
      perShard = (
        await tx.exec<{ idx: number; n: number }>(
          `select shard_idx as idx, count(*) as n from samples where run_id = ? and status = 'pending' group by shard_idx`,
          [runId],
        )
      ).rows;
      if (perShard.length) await tx.exec(`update samples set status = 'cancelled' where run_id = ? and status = 'pending'`, [runId]);
    }
    if (!perShard.length) return;
    let total = 0;
    for (const s of perShard) {
      const n = Number(s.n);
      total += n;
      await tx.q
        .update(shards)
        .set({ terminalCount: sql`${shards.terminalCount} + ${n}` })
        .where(and(eq(shards.runId, runId), eq(shards.idx, s.idx)));
    }
    await tx.q
      .update(runs)
      .set({ pending: sql`${runs.pending} - ${total}`, cancelled: sql`${runs.cancelled} + ${total}` })
      .where(eq(runs.id, runId));
  });
}

/** Rows a statement of dropCancelledSamples deletes: small enough that the writer is never held for long. */
const DROP_BATCH = 5000;

/**
 * Deletes a run's cancelled samples outside its calibration slice, a batch at a time: a dry run's
 * unanswered input once its forecast is made (the run's counters still count them as cancelled).
 */
export async function dropCancelledSamples(db: Db, runId: string): Promise<number> {
  const { samples } = db.t;
  let dropped = 0;
  for (;;) {
    const batch = db.q
      .select({ id: samples.id })
      .from(samples)
      .where(and(eq(samples.runId, runId), eq(samples.status, 'cancelled'), eq(samples.calibration, false)))
      .limit(DROP_BATCH);
    const gone = await db.write((w) => w.q.delete(samples).where(inArray(samples.id, batch)).returning({ id: samples.id }));
    dropped += gone.length;
    if (gone.length < DROP_BATCH) return dropped;
  }
}

/** One valid input line, as ingest inserts it. */
export interface NewSample {
  customId: string;
  request: string;
  predictedTokens: number | null;
  /** The index of its variant; none when the run has none. */
  variant?: number | null;
  /** In a run with a split: the line's split, and each of its samples' shard by sample_index (its seq does not place it then). */
  split?: string | null;
  shardIdxs?: readonly number[];
  /** 0 for a conversation (its first turn); absent for a single request. */
  turn?: number | null;
}

/**
 * Inserts a batch of a run's lines at the next input positions, from `firstSeq` on, `perLine`
 * samples a line (params.n: sample_index 0…perLine−1 at consecutive positions); a line whose
 * custom_id the run already has (or that repeats one earlier in the batch) is skipped and takes no
 * position. Returns which lines were inserted, in order. Call it in a transaction.
 */
export async function insertSampleBatch(
  tx: DbOrTx,
  runId: string,
  firstSeq: number,
  shardSize: number,
  batch: readonly NewSample[],
  perLine = 1,
): Promise<boolean[]> {
  if (tx.dialect === 'pg') return insertSampleBatchPg(tx, runId, firstSeq, shardSize, batch, perLine);
  if (!tx.inTx) throw new Error('insertSampleBatch runs in a transaction');
  // The statement runs row after row on the transaction's connection without yielding: an await a
  // row (a promise and a turn of the microtask queue each) cost ingest about a tenth of its time.
  const insert = sqliteClient(tx).prepare(
    `insert into samples (run_id, seq, shard_idx, custom_id, sample_index, status, request, predicted_tokens, variant, split, turn)
     values (?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?)
     on conflict (run_id, custom_id, sample_index) do nothing`,
  );
  const inserted: boolean[] = [];
  let seq = firstSeq;
  for (const s of batch) {
    let added = false;
    for (let k = 0; k < perLine; k++) {
      const { changes } = insert.run(
        runId,
        seq + k,
        s.shardIdxs?.[k] ?? Math.floor((seq + k) / shardSize),
        s.customId,
        k,
        s.request,
        s.predictedTokens,
        s.variant ?? null,
        s.split ?? null,
        s.turn ?? null,
      );
      // A line is inserted whole or not at all: its first answer decides.
      if (changes === 0) break;
      added = true;
    }
    inserted.push(added);
    if (added) seq += perLine;
  }
  return inserted;
}

/**
 * PostgreSQL: the batch goes in as one statement. A custom_id repeated within the batch is dropped
 * first; one the run already has is skipped by the unique index, and the positions after it are
 * then closed up, so the run's positions stay contiguous.
 */
async function insertSampleBatchPg(
  tx: DbOrTx,
  runId: string,
  firstSeq: number,
  shardSize: number,
  batch: readonly NewSample[],
  perLine: number,
): Promise<boolean[]> {
  const seen = new Set<string>();
  const sent: NewSample[] = [];
  const fresh = batch.map((s) => {
    if (seen.has(s.customId)) return false;
    seen.add(s.customId);
    sent.push(s);
    return true;
  });
  if (!sent.length) return fresh;
  // One column of the statement: a value for each of each line's perLine rows (a loop: nine columns of a
  // 1,000-line batch through flatMap and Array.from cost ingest a quarter of its CPU).
  const rowsOf = <T>(f: (s: NewSample, i: number, k: number) => T): T[] => {
    const column = new Array<T>(sent.length * perLine);
    for (let i = 0, j = 0; i < sent.length; i++) for (let k = 0; k < perLine; k++) column[j++] = f(sent[i], i, k);
    return column;
  };
  const seqs = rowsOf((_, i, k) => firstSeq + i * perLine + k);
  const { rows } = await tx.exec<{ custom_id: string }>(
    `insert into samples (run_id, seq, shard_idx, custom_id, sample_index, status, request, predicted_tokens, variant, split, turn)
     select ?, u.seq, u.shard_idx, u.custom_id, u.sample_index, 'pending', u.request, u.predicted, u.variant, u.split, u.turn
     from unnest(?::bigint[], ?::int[], ?::text[], ?::int[], ?::text[], ?::int[], ?::int[], ?::text[], ?::int[])
       as u(seq, shard_idx, custom_id, sample_index, request, predicted, variant, split, turn)
     on conflict (run_id, custom_id, sample_index) do nothing returning custom_id`,
    [
      runId,
      seqs,
      rowsOf((s, i, k) => s.shardIdxs?.[k] ?? Math.floor((firstSeq + i * perLine + k) / shardSize)),
      rowsOf((s) => s.customId),
      rowsOf((_, __, k) => k),
      rowsOf((s) => s.request),
      rowsOf((s) => s.predictedTokens),
      rowsOf((s) => s.variant ?? null),
      rowsOf((s) => s.split ?? null),
      rowsOf((s) => s.turn ?? null),
    ],
  );
  const inserted = new Set(rows.map((r) => r.custom_id));
  if (inserted.size < sent.length) {
    // Some were already in the run: the ones after them move up to close the gaps.
    const moved = { id: [] as string[], index: [] as number[], seq: [] as number[], shard: [] as number[] };
    let next = firstSeq;
    for (const [i, s] of sent.entries()) {
      if (!inserted.has(s.customId)) continue;
      for (let k = 0; k < perLine; k++) {
        if (firstSeq + i * perLine !== next) {
          moved.id.push(s.customId);
          moved.index.push(k);
          moved.seq.push(next + k);
          moved.shard.push(s.shardIdxs?.[k] ?? Math.floor((next + k) / shardSize));
        }
      }
      next += perLine;
    }
    if (moved.id.length) {
      await tx.exec(
        `update samples as s set seq = v.seq, shard_idx = v.shard from unnest(?::text[], ?::int[], ?::bigint[], ?::int[]) as v(custom_id, sample_index, seq, shard)
         where s.run_id = ? and s.custom_id = v.custom_id and s.sample_index = v.sample_index`,
        [moved.id, moved.index, moved.seq, moved.shard, runId],
      );
    }
  }
  let at = 0;
  return fresh.map((f) => f && inserted.has(sent[at++].customId));
}

/** Drops what an attempt at validating a run inserted: its samples and its shards. */
export async function clearRunSamples(db: DbOrTx, runId: string): Promise<void> {
  const { samples, shards, sampleTurns } = db.t;
  await db.tx(async (tx) => {
    await tx.q.delete(samples).where(eq(samples.runId, runId));
    await tx.q.delete(shards).where(eq(shards.runId, runId));
    await deleteRunVariants(tx, runId);
    await tx.q.delete(sampleTurns).where(eq(sampleTurns.runId, runId));
  });
}

/** The samples a retry puts back in the queue: the failed ones, or the completed ones with a flag. */
export async function samplesToRetry(
  db: DbOrTx,
  runId: string,
  only: 'failed' | 'flagged',
  endpointId?: string,
): Promise<{ id: number; shardIdx: number; flags: number; variant: number | null; turn: number | null }[]> {
  const { samples } = db.t;
  const which = and(
    eq(samples.runId, runId),
    only === 'failed' ? eq(samples.status, 'failed') : and(eq(samples.status, 'completed'), ne(samples.flags, 0)),
    endpointId === undefined ? undefined : eq(samples.endpointId, endpointId),
  );
  // Locked on PostgreSQL: two retries of one run at once (a double click, a quarantine and an
  // operator) would each count the same samples back; the second waits and then finds none.
  return await locked(
    db,
    db.q.select({ id: samples.id, shardIdx: samples.shardIdx, flags: samples.flags, variant: samples.variant, turn: samples.turn }).from(samples).where(which),
  );
}

/** Makes samples pending again with a fresh attempt budget, as if never sent. */
export async function requeueSamples(db: DbOrTx, ids: number[]): Promise<void> {
  const { samples } = db.t;
  await db.write((w) =>
    w.q
      .update(samples)
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
        maxTokens: null,
        leaseOwner: null,
        leaseExpiresAt: null,
      })
      .where(inArray(samples.id, ids)),
  );
}

/** Sets the turn a conversation is to be asked from (a retry's). */
export async function setSampleTurn(db: DbOrTx, id: number, turn: number): Promise<void> {
  const { samples } = db.t;
  await db.write((w) => w.q.update(samples).set({ turn }).where(eq(samples.id, id)));
}

/**
 * A run's latest completed samples, newest first: what the quality window held before a restart.
 * Samples are sent in input order, so the last ones in input order are the latest; the (run_id,
 * seq) index serves that walk, where ordering by completed_at would read the whole run.
 */
export async function recentCompleted(
  db: DbOrTx,
  runId: string,
  limit: number,
): Promise<{ flags: number; endpointId: string | null; variant: number | null }[]> {
  const { samples } = db.t;
  return await db.q
    .select({ flags: samples.flags, endpointId: samples.endpointId, variant: samples.variant })
    .from(samples)
    .where(and(eq(samples.runId, runId), eq(samples.status, 'completed')))
    .orderBy(desc(samples.seq))
    .limit(limit);
}

/** How many completed samples of a run have each completion length: (tokens, samples) pairs, from samples_completion_tokens_idx. */
export async function completionLengthCounts(db: Db, runId: string): Promise<[number, number][]> {
  const { rows } = await db.exec<{ tokens: number; n: number | string }>(
    `select completion_tokens as tokens, count(*) as n from samples where run_id = ? and status = 'completed' and completion_tokens is not null group by completion_tokens`,
    [runId],
  );
  return rows.map((r) => [r.tokens, Number(r.n)]);
}

/**
 * The same per variant: (tokens, samples, variant) triples. It reads the completed rows (the index
 * holds no variant): once per start of a run with variants.
 */
export async function completionLengthCountsByVariant(db: Db, runId: string): Promise<[number, number, number | null][]> {
  const { rows } = await db.exec<{ tokens: number; n: number | string; variant: number | null }>(
    `select completion_tokens as tokens, variant, count(*) as n from samples where run_id = ? and status = 'completed' and completion_tokens is not null
     group by variant, completion_tokens`,
    [runId],
  );
  return rows.map((r) => [r.tokens, Number(r.n), r.variant === null ? null : Number(r.variant)]);
}

/**
 * Points samples at the endpoint whose prefix cache holds their prompts (by custom_id): dispatch
 * sends each there first. A conversation's next turn is set by its answer; this sets it directly.
 */
export async function setAffinity(db: Db, runId: string, endpoints: ReadonlyMap<string, string>): Promise<void> {
  const { samples } = db.t;
  await db.tx(async (tx) => {
    for (const [customId, endpointId] of endpoints) {
      await tx.q
        .update(samples)
        .set({ affinityEndpointId: endpointId })
        .where(and(eq(samples.runId, runId), eq(samples.customId, customId)));
    }
  });
}
