import { and, asc, eq, gte, inArray, isNull, lt, or } from 'drizzle-orm';
import { agedOut, compactSeries, HISTORY_TIERS, type HistoryPoint } from '../domain/history.js';
import { ACTIVE_RUN_STATUSES } from '../domain/statuses.js';
import type { DbOrTx } from './client.js';

/** A point of a series: the fleet's (runId null) or a run's. */
export interface SeriesPoint extends HistoryPoint {
  runId: string | null;
}

/** What the recorder differences between two readings: each run's answer and token counters. */
export interface RunCounters {
  id: string;
  completed: number;
  completionTokens: number;
  promptTokens: number;
  cachedTokens: number;
}

/** The counters of the runs being worked on, and of those that finished since `since` (their last answers count too). */
export async function runCounters(db: DbOrTx, since: number): Promise<RunCounters[]> {
  const { runs } = db.t;
  return await db.q
    .select({
      id: runs.id,
      completed: runs.completed,
      completionTokens: runs.completionTokens,
      promptTokens: runs.promptTokens,
      cachedTokens: runs.cachedTokens,
    })
    .from(runs)
    .where(or(inArray(runs.status, [...ACTIVE_RUN_STATUSES]), gte(runs.finishedAt, since)));
}

export async function addHistory(db: DbOrTx, points: readonly SeriesPoint[]): Promise<void> {
  if (!points.length) return;
  await db.write((w) => w.q.insert(w.t.history).values([...points]));
}

/**
 * Merges the points that aged out of their tier into the next tier's, in one transaction. Only the
 * aged points are read: a minute's worth for each series, whatever its length.
 */
export async function compactHistory(db: DbOrTx, now: number): Promise<void> {
  const { history } = db.t;
  const aged = HISTORY_TIERS.slice(0, -1).map((_, tier) => agedOut(tier, now));
  await db.tx(async (tx) => {
    const rows = await tx.q
      .select()
      .from(history)
      .where(or(...aged.map(({ stepMs, before }) => and(eq(history.stepMs, stepMs), lt(history.at, before)))));
    if (!rows.length) return;
    const bySeries = new Map<string | null, HistoryPoint[]>();
    for (const { id: _id, runId, ...point } of rows) {
      const series = bySeries.get(runId);
      if (series) series.push(point);
      else bySeries.set(runId, [point]);
    }
    await tx.q.delete(history).where(
      inArray(
        history.id,
        rows.map((r) => r.id),
      ),
    );
    await tx.q.insert(history).values([...bySeries].flatMap(([runId, points]) => compactSeries(points, now).map((p) => ({ ...p, runId }))));
  });
}

/** A series, oldest first: the fleet's when `runId` is null; the points that start in [since, until) when given. */
export async function readHistory(db: DbOrTx, runId: string | null, range: { since?: number; until?: number } = {}): Promise<SeriesPoint[]> {
  const { history } = db.t;
  return await db.q
    .select()
    .from(history)
    .where(
      and(
        runId === null ? isNull(history.runId) : eq(history.runId, runId),
        range.since === undefined ? undefined : gte(history.at, range.since),
        range.until === undefined ? undefined : lt(history.at, range.until),
      ),
    )
    .orderBy(asc(history.at));
}
