import { and, desc, eq, inArray, lt, sql, type SQL } from 'drizzle-orm';
import type { Db } from './client.js';
import { appendEvent } from './events.js';
import { runs, type RunRow } from './schema.js';
import { canTransition, TERMINAL_RUN_STATUSES, type RunStatus } from '../domain/statuses.js';


export function getRun(db: Db, id: string): RunRow | undefined {
  return db.select().from(runs).where(eq(runs.id, id)).get();
}

export function getRunByIdempotencyKey(db: Db, key: string): RunRow | undefined {
  return db.select().from(runs).where(eq(runs.idempotencyKey, key)).get();
}

export function listRuns(db: Db, opts: { status?: RunStatus; after?: string; limit: number }): RunRow[] {
  const where: SQL[] = [];
  if (opts.status) where.push(eq(runs.status, opts.status));
  if (opts.after) where.push(lt(runs.id, opts.after));
  return db
    .select()
    .from(runs)
    .where(and(...where))
    .orderBy(desc(runs.id))
    .limit(opts.limit + 1)
    .all();
}

/**
 * Moves a run to a new status when it is in one of `from`, recording an event; returns false when
 * the run was not in an allowed status (someone else moved it first).
 */
export function transitionRun(
  db: Db,
  id: string,
  from: readonly RunStatus[],
  to: RunStatus,
  now: number,
  extra: Partial<Pick<RunRow, 'statusReason' | 'startedAt' | 'finishedAt' | 'gateOverridden'>> = {},
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
    appendEvent(tx as unknown as Db, id, 'status', { status: to, reason: set.statusReason ?? null }, now);
    return true;
  });
}

/** Runs in any of `statuses`, highest priority first, then oldest: the order the runner serves them in. */
export function listRunsByStatus(db: Db, statuses: readonly RunStatus[]): RunRow[] {
  return db
    .select()
    .from(runs)
    .where(inArray(runs.status, [...statuses]))
    .orderBy(sql`${runs.priority} desc`, runs.createdAt)
    .all();
}

export function setManifestKey(db: Db, id: string, key: string): void {
  db.update(runs).set({ manifestKey: key }).where(eq(runs.id, id)).run();
}
