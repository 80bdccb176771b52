import { and, count, desc, eq, gte, inArray, lt, notInArray, or, sql, type SQL } from 'drizzle-orm';
import type { DbOrTx } from './client.js';
import { appendEvent } from './events.js';
import { runs, type RunRow } from './schema.js';
import { FLAG_COLUMNS, type Flag } from '../domain/flags.js';
import { isWebhookRunStatus } from '../domain/webhooks.js';
import { enqueueRunEvent } from './webhooks.js';
import { canTransition, TERMINAL_RUN_STATUSES, type RunStatus } from '../domain/statuses.js';

export function getRun(db: DbOrTx, id: string): RunRow | undefined {
  return db.select().from(runs).where(eq(runs.id, id)).get();
}

export async function getRunByIdempotencyKey(db: DbOrTx, key: string): Promise<RunRow | undefined> {
  const [row] = await db.select().from(runs).where(eq(runs.idempotencyKey, key)).limit(1);
  return row;
}

export async function listRuns(db: DbOrTx, opts: { status?: RunStatus; after?: string; limit: number }): Promise<RunRow[]> {
  const where: SQL[] = [];
  if (opts.status) where.push(eq(runs.status, opts.status));
  if (opts.after) where.push(lt(runs.id, opts.after));
  return await db
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
export function transitionRun(
  db: DbOrTx,
  id: string,
  from: readonly RunStatus[],
  to: RunStatus,
  now: number,
  extra: Partial<Pick<RunRow, 'statusReason' | 'startedAt' | 'finishedAt' | 'gateOverridden' | 'expiredAt'>> = {},
): boolean {
  for (const f of from) if (!canTransition(f, to)) throw new Error(`a run cannot go from ${f} to ${to}`);
  return db.transaction((tx) => {
    const set: Partial<RunRow> = { status: to, updatedAt: now, statusReason: null, ...extra };
    if (TERMINAL_RUN_STATUSES.includes(to) && extra.finishedAt === undefined) set.finishedAt = now;
    const res = tx
      .update(runs)
      .set(set)
      .where(and(eq(runs.id, id), sql`${runs.status} in ${from}`))
      .run();
    if (res.changes === 0) return false;
    appendEvent(tx, id, 'status', { status: to, reason: set.statusReason ?? null }, now);
    if (isWebhookRunStatus(to)) enqueueRunEvent(tx, id, to, set.statusReason ?? null, now);
    return true;
  });
}

/** Runs in any of `statuses`, highest priority first, then oldest: the order the runner serves them in. */
export function listRunsByStatus(db: DbOrTx, statuses: readonly RunStatus[]): RunRow[] {
  return db
    .select()
    .from(runs)
    .where(inArray(runs.status, [...statuses]))
    .orderBy(sql`${runs.priority} desc`, runs.createdAt)
    .all();
}

export function setManifestKey(db: DbOrTx, id: string, key: string): void {
  db.update(runs).set({ manifestKey: key }).where(eq(runs.id, id)).run();
}
export function insertRun(db: DbOrTx, row: typeof runs.$inferInsert): void {
  db.insert(runs).values(row).run();
}

/** The run that writes its output under this prefix, if any. */
export async function getRunByOutputUri(db: DbOrTx, uri: string): Promise<{ id: string } | undefined> {
  const [row] = await db.select({ id: runs.id }).from(runs).where(eq(runs.outputUri, uri)).limit(1);
  return row;
}

/** A run still validating this uploaded file: the file cannot go while it is read. */
export async function getRunValidatingFile(db: DbOrTx, fileId: string): Promise<{ id: string } | undefined> {
  // Few runs validate at once: the status filters them first, and only their inputs are looked into.
  const validating = await db.select({ id: runs.id, input: runs.input }).from(runs).where(eq(runs.status, 'validating'));
  return validating.find((r) => 'file_id' in r.input && r.input.file_id === fileId);
}

export async function validatingRunIds(db: DbOrTx): Promise<string[]> {
  const rows = await db.select({ id: runs.id }).from(runs).where(eq(runs.status, 'validating'));
  return rows.map((r) => r.id);
}

/** What validation found: the invalid lines, and once the run is laid out its sample and shard totals. */
export function setRunValidation(
  db: DbOrTx,
  id: string,
  set: Pick<RunRow, 'invalidLines' | 'lineErrors' | 'updatedAt'> & Partial<Pick<RunRow, 'total' | 'pending' | 'shardsTotal' | 'predictedSamples'>>,
): void {
  db.update(runs).set(set).where(eq(runs.id, id)).run();
}

/**
 * Moves `n` retried samples out of the failed (or the completed and flagged) counters back to
 * pending, takes back the shards they reopen, and drops the manifest that no longer holds.
 */
export function uncountRequeued(
  db: DbOrTx,
  id: string,
  r: { only: 'failed' | 'flagged'; n: number; byFlag: Record<Flag, number>; reopenedUploaded: number; now: number },
): void {
  const counters =
    r.only === 'failed'
      ? { failed: sql`${runs.failed} - ${r.n}` }
      : {
          completed: sql`${runs.completed} - ${r.n}`,
          flagged: sql`${runs.flagged} - ${r.n}`,
          ...Object.fromEntries(FLAG_COLUMNS.map(({ flag, key }) => [key, sql`${runs[key]} - ${r.byFlag[flag]}`])),
        };
  db.update(runs)
    .set({
      ...counters,
      pending: sql`${runs.pending} + ${r.n}`,
      shardsUploaded: sql`${runs.shardsUploaded} - ${r.reopenedUploaded}`,
      manifestKey: null,
      updatedAt: r.now,
    })
    .where(eq(runs.id, id))
    .run();
}

export async function runCountsByStatus(db: DbOrTx): Promise<{ status: string; n: number }[]> {
  return await db.select({ status: runs.status, n: count() }).from(runs).groupBy(runs.status);
}

/** The sample counters of runs not finished, or finished at `finishedSince` or later. */
export async function recentRunSampleCounts(db: DbOrTx, finishedSince: number) {
  return await db
    .select({
      id: runs.id,
      model: runs.model,
      pending: runs.pending,
      in_progress: runs.inProgress,
      completed: runs.completed,
      failed: runs.failed,
      cancelled: runs.cancelled,
      loopsStopped: runs.loopsStopped,
      loopTokensSaved: runs.loopTokensSaved,
    })
    .from(runs)
    .where(or(notInArray(runs.status, [...TERMINAL_RUN_STATUSES]), gte(runs.finishedAt, finishedSince)));
}

/** Sets a run's status_reason without moving its status, only while its status is one of `statuses`. */
export function setStatusReason(db: DbOrTx, id: string, reason: string | null, statuses: readonly RunStatus[]): boolean {
  return (
    db
      .update(runs)
      .set({ statusReason: reason })
      .where(and(eq(runs.id, id), inArray(runs.status, [...statuses])))
      .run().changes > 0
  );
}

/** A run's status alone: cheap enough to ask often (ingest asks every batch of lines). */
export async function getRunStatus(db: DbOrTx, id: string): Promise<string | undefined> {
  const [row] = await db.select({ status: runs.status }).from(runs).where(eq(runs.id, id)).limit(1);
  return row?.status;
}
