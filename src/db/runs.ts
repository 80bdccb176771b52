import { and, count, desc, eq, gte, inArray, lt, notInArray, or, sql, type SQL } from 'drizzle-orm';
import { type DbOrTx, locked, type Tables } from './client.js';
import { appendEvent } from './events.js';
import type { RunRow } from './schema.js';
import { FLAG_COLUMNS, type Flag } from '../domain/flags.js';
import { isWebhookRunStatus } from '../domain/webhooks.js';
import { enqueueRunEvent } from './webhooks.js';
import { canTransition, TERMINAL_RUN_STATUSES, type RunStatus } from '../domain/statuses.js';

export type RunInsert = Tables['runs']['$inferInsert'];

export async function getRun(db: DbOrTx, id: string): Promise<RunRow | undefined> {
  const { runs } = db.t;
  const [row] = await db.q.select().from(runs).where(eq(runs.id, id)).limit(1);
  return row;
}

/** A run's row, locked until the transaction ends (PostgreSQL; a SQLite transaction holds the whole database). */
export async function lockRun(tx: DbOrTx, id: string): Promise<RunRow | undefined> {
  const { runs } = tx.t;
  const [row] = await locked(tx, tx.q.select().from(runs).where(eq(runs.id, id)).limit(1));
  return row;
}

export async function getRunByIdempotencyKey(db: DbOrTx, key: string): Promise<RunRow | undefined> {
  const { runs } = db.t;
  const [row] = await db.q.select().from(runs).where(eq(runs.idempotencyKey, key)).limit(1);
  return row;
}

export async function listRuns(db: DbOrTx, opts: { status?: RunStatus; name?: string; after?: string; limit: number }): Promise<RunRow[]> {
  const { runs } = db.t;
  const where: SQL[] = [];
  if (opts.status) where.push(eq(runs.status, opts.status));
  // A part of the name, in any case: the pattern's own wildcards are matched as themselves.
  if (opts.name) where.push(sql`lower(${runs.name}) like ${`%${opts.name.toLowerCase().replace(/[\\%_]/g, (c) => `\\${c}`)}%`} escape '\\'`);
  if (opts.after) where.push(lt(runs.id, opts.after));
  return await db.q
    .select()
    .from(runs)
    .where(and(...where))
    .orderBy(desc(runs.id))
    .limit(opts.limit + 1);
}

/**
 * Moves a run to a new status when it is in one of `from`, recording an event (and its webhook's,
 * in the same transaction, so a crash cannot keep the one and lose the other); returns false when
 * the run was not in an allowed status (someone else moved it first).
 */
export async function transitionRun(
  db: DbOrTx,
  id: string,
  from: readonly RunStatus[],
  to: RunStatus,
  now: number,
  extra: Partial<Pick<RunRow, 'statusReason' | 'startedAt' | 'finishedAt' | 'gateOverridden' | 'expiredAt'>> = {},
): Promise<boolean> {
  for (const f of from) if (!canTransition(f, to)) throw new Error(`a run cannot go from ${f} to ${to}`);
  const { runs } = db.t;
  return db.tx(async (tx) => {
    const set: Partial<RunRow> = { status: to, updatedAt: now, statusReason: null, ...extra };
    if (TERMINAL_RUN_STATUSES.includes(to) && extra.finishedAt === undefined) set.finishedAt = now;
    const moved = await tx.q
      .update(runs)
      .set(set)
      .where(and(eq(runs.id, id), inArray(runs.status, [...from])))
      .returning({ id: runs.id });
    if (moved.length === 0) return false;
    await appendEvent(tx, id, 'status', { status: to, reason: set.statusReason ?? null }, now);
    if (isWebhookRunStatus(to)) await enqueueRunEvent(tx, id, to, set.statusReason ?? null, now);
    return true;
  });
}

/** Runs in any of `statuses`, highest priority first, then oldest: the order the runner serves them in. */
export async function listRunsByStatus(db: DbOrTx, statuses: readonly RunStatus[]): Promise<RunRow[]> {
  const { runs } = db.t;
  return await db.q
    .select()
    .from(runs)
    .where(inArray(runs.status, [...statuses]))
    .orderBy(desc(runs.priority), runs.createdAt);
}

export async function setManifestKey(db: DbOrTx, id: string, key: string): Promise<void> {
  const { runs } = db.t;
  await db.write((w) => w.q.update(runs).set({ manifestKey: key }).where(eq(runs.id, id)));
}

export async function insertRun(db: DbOrTx, row: RunInsert): Promise<void> {
  const { runs } = db.t;
  // The webhook secret is sealed (`secrets.ts`); it is read back only to sign (`runWebhookSecret`).
  await db.write((w) => w.q.insert(runs).values({ ...row, webhookSecret: db.secrets.seal(row.webhookSecret) }));
}

/**
 * A run whose output prefix is `uri`, lies inside it or holds it: two such runs would write into
 * each other's objects. Prefixes compare as strings, so both must be in canonical form.
 */
export async function getRunOverlappingOutput(db: DbOrTx, uri: string): Promise<{ id: string; outputUri: string } | undefined> {
  const { runs } = db.t;
  const [row] = await db.q
    .select({ id: runs.id, outputUri: runs.outputUri })
    .from(runs)
    .where(
      or(
        eq(runs.outputUri, uri),
        // Cast: PostgreSQL cannot choose between substr's and length's text and bytea forms for a bare parameter.
        sql`substr(cast(${uri} as text), 1, length(${runs.outputUri})) = ${runs.outputUri}`,
        sql`substr(${runs.outputUri}, 1, length(cast(${uri} as text))) = cast(${uri} as text)`,
      ),
    )
    .limit(1);
  return row;
}

/** Any constant: the key of the advisory lock under which one create at a time claims its output prefix. */
const OUTPUT_CLAIM_LOCK = 7_240_414;

/**
 * Makes the creates of runs take turns until the transaction ends, so that of two racing creates
 * with nested prefixes the second sees the first's row before it inserts its own (the unique index
 * covers equal prefixes only). SQLite's transaction takes the write lock when it begins (BEGIN
 * IMMEDIATE); PostgreSQL's read committed would let both look before either inserts.
 */
export async function serializeOutputClaims(tx: DbOrTx): Promise<void> {
  if (!tx.inTx) throw new Error('serializeOutputClaims holds only within a transaction');
  if (tx.dialect === 'pg') await tx.exec('select pg_advisory_xact_lock(?)', [OUTPUT_CLAIM_LOCK]);
}

/** A run whose output prefix is `uri` or lies inside it (canonical form, as above). */
export async function getRunOutputWithin(db: DbOrTx, uri: string): Promise<{ id: string; outputUri: string } | undefined> {
  const { runs } = db.t;
  const [row] = await db.q
    .select({ id: runs.id, outputUri: runs.outputUri })
    .from(runs)
    .where(sql`substr(${runs.outputUri}, 1, length(cast(${uri} as text))) = cast(${uri} as text)`)
    .limit(1);
  return row;
}

/** Every run's output prefix (with its folder's identity and its status), for bringing old rows to the canonical form and sweeping. */
export async function listOutputUris(db: DbOrTx): Promise<{ id: string; outputUri: string; outputFolder: string | null; status: string }[]> {
  const { runs } = db.t;
  return await db.q.select({ id: runs.id, outputUri: runs.outputUri, outputFolder: runs.outputFolder, status: runs.status }).from(runs);
}

/** Moves a run's output prefix to another spelling of the same place. */
export async function setOutputUri(db: DbOrTx, id: string, uri: string): Promise<void> {
  const { runs } = db.t;
  await db.write((w) => w.q.update(runs).set({ outputUri: uri }).where(eq(runs.id, id)));
}

/** Records the identity of a run's local folder that a write made again after it was removed. */
export async function setOutputFolder(db: DbOrTx, id: string, folder: string): Promise<void> {
  const { runs } = db.t;
  await db.write((w) => w.q.update(runs).set({ outputFolder: folder }).where(eq(runs.id, id)));
}

/** A run still validating this uploaded file: the file cannot go while it is read. */
export async function getRunValidatingFile(db: DbOrTx, fileId: string): Promise<{ id: string } | undefined> {
  // Few runs validate at once: the status filters them first, and only their inputs are looked into.
  const { runs } = db.t;
  const validating = await db.q.select({ id: runs.id, input: runs.input }).from(runs).where(eq(runs.status, 'validating'));
  return validating.find((r) => 'file_id' in r.input && r.input.file_id === fileId);
}

export async function validatingRunIds(db: DbOrTx): Promise<string[]> {
  const { runs } = db.t;
  const rows = await db.q.select({ id: runs.id }).from(runs).where(eq(runs.status, 'validating'));
  return rows.map((r) => r.id);
}

/** What validation found: the invalid lines, and once the run is laid out its sample and shard totals. */
export async function setRunValidation(
  db: DbOrTx,
  id: string,
  set: Pick<RunRow, 'invalidLines' | 'lineErrors' | 'updatedAt'> &
    Partial<Pick<RunRow, 'total' | 'pending' | 'shardsTotal' | 'predictedSamples' | 'turnsTotal' | 'turnsMax'>>,
): Promise<void> {
  const { runs } = db.t;
  await db.write((w) => w.q.update(runs).set(set).where(eq(runs.id, id)));
}

/**
 * Moves `n` retried samples out of the failed (or the completed and flagged) counters back to
 * pending, takes back the shards they reopen, and drops the manifest that no longer holds.
 */
export async function uncountRequeued(
  db: DbOrTx,
  id: string,
  r: {
    only: 'failed' | 'flagged';
    n: number;
    byFlag: Record<Flag, number>;
    reopenedUploaded: number;
    now: number;
    /** Conversations': the answered turns dropped to be asked again (the tool-call steps among them), and the failed turns to be asked again. */
    turns?: { completed: number; failed: number; toolSteps: number };
  },
): Promise<void> {
  const { runs } = db.t;
  const turns = r.turns ?? { completed: 0, failed: 0, toolSteps: 0 };
  const counters =
    r.only === 'failed'
      ? { failed: sql`${runs.failed} - ${r.n}` }
      : {
          completed: sql`${runs.completed} - ${r.n}`,
          flagged: sql`${runs.flagged} - ${r.n}`,
          ...Object.fromEntries(FLAG_COLUMNS.map(({ flag, key }) => [key, sql`${runs[key]} - ${r.byFlag[flag]}`])),
        };
  await db.write((w) =>
    w.q
      .update(runs)
      .set({
        ...counters,
        pending: sql`${runs.pending} + ${r.n}`,
        shardsUploaded: sql`${runs.shardsUploaded} - ${r.reopenedUploaded}`,
        turnsCompleted: sql`${runs.turnsCompleted} - ${turns.completed}`,
        turnsFailed: sql`${runs.turnsFailed} - ${turns.failed}`,
        toolSteps: sql`${runs.toolSteps} - ${turns.toolSteps}`,
        manifestKey: null,
        updatedAt: r.now,
      })
      .where(eq(runs.id, id)),
  );
}

export async function runCountsByStatus(db: DbOrTx): Promise<{ status: string; n: number }[]> {
  const { runs } = db.t;
  return await db.q.select({ status: runs.status, n: count() }).from(runs).groupBy(runs.status);
}

/** The sample counters of runs not finished, or finished at `finishedSince` or later. */
export async function recentRunSampleCounts(db: DbOrTx, finishedSince: number) {
  const { runs } = db.t;
  return await db.q
    .select({
      id: runs.id,
      model: runs.model,
      total: runs.total,
      pending: runs.pending,
      in_progress: runs.inProgress,
      completed: runs.completed,
      failed: runs.failed,
      cancelled: runs.cancelled,
      loopsStopped: runs.loopsStopped,
      loopTokensSaved: runs.loopTokensSaved,
      promptTokens: runs.promptTokens,
      completionTokens: runs.completionTokens,
      cachedTokens: runs.cachedTokens,
      regenerate: runs.regenerate,
      params: runs.params,
      turnsTotal: runs.turnsTotal,
      turnsCompleted: runs.turnsCompleted,
      turnsFailed: runs.turnsFailed,
    })
    .from(runs)
    .where(or(notInArray(runs.status, [...TERMINAL_RUN_STATUSES]), gte(runs.finishedAt, finishedSince)));
}

/** Sets a run's status_reason without moving its status, only while its status is one of `statuses`. */
export async function setStatusReason(db: DbOrTx, id: string, reason: string | null, statuses: readonly RunStatus[]): Promise<boolean> {
  const { runs } = db.t;
  const set = await db.write((w) =>
    w.q
      .update(runs)
      .set({ statusReason: reason })
      .where(and(eq(runs.id, id), inArray(runs.status, [...statuses])))
      .returning({ id: runs.id }),
  );
  return set.length > 0;
}

/** A run's status alone: cheap enough to ask often (ingest asks every batch of lines). */
export async function getRunStatus(db: DbOrTx, id: string): Promise<string | undefined> {
  const { runs } = db.t;
  const [row] = await db.q.select({ status: runs.status }).from(runs).where(eq(runs.id, id)).limit(1);
  return row?.status;
}

/** Ended runs whose output lifetime (`output_expires_after`, from the finish) has passed and whose output is not yet deleted. */
export async function dueOutputExpiries(db: DbOrTx, now: number, limit: number): Promise<RunRow[]> {
  const { runs } = db.t;
  return await db.q
    .select()
    .from(runs)
    .where(
      and(
        inArray(runs.status, [...TERMINAL_RUN_STATUSES]),
        sql`${runs.outputExpiredAt} is null`,
        // 64-bit arithmetic: on PostgreSQL an integer column times an integer is 32-bit, past which 25 of the 30 allowed days overflow.
        sql`${runs.finishedAt} + ${runs.outputExpiresAfter} * cast(1000 as bigint) <= ${now}`,
      ),
    )
    .limit(limit);
}

/**
 * Marks a run's output deleted (its row, samples and counters stay), if it is still ended: a retry
 * that reopened it meanwhile keeps its output. The answers of its conversations' turns (and their
 * token ids) go with it. Returns whether it was marked.
 */
export async function markOutputExpired(db: DbOrTx, id: string, at: number): Promise<boolean> {
  const { runs, sampleTurns } = db.t;
  return await db.tx(async (tx) => {
    const marked = await tx.q
      .update(runs)
      .set({ outputExpiredAt: at })
      .where(and(eq(runs.id, id), sql`${runs.outputExpiredAt} is null`, inArray(runs.status, [...TERMINAL_RUN_STATUSES])))
      .returning({ id: runs.id });
    if (marked.length === 0) return false;
    await tx.q.delete(sampleTurns).where(eq(sampleTurns.runId, id));
    return true;
  });
}
