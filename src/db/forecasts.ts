import { asc, eq } from 'drizzle-orm';
import { type DbOrTx, IDS_PER_STATEMENT } from './client.js';
import type { StoredForecast } from '../domain/forecast.js';
import { sliceFrom } from './samples.js';

/** Keeps a run's latest forecast on its row, and, when `point` says so, one more point of its history. */
export async function saveForecast(db: DbOrTx, runId: string, forecast: StoredForecast, point: { fraction: number } | null): Promise<void> {
  const { runs, forecasts } = db.t;
  await db.tx(async (tx) => {
    await tx.q.update(runs).set({ forecast }).where(eq(runs.id, runId));
    if (!point) return;
    const { at, finishes_at, low, high, completion_tokens_estimate } = forecast;
    await tx.q.insert(forecasts).values({
      runId,
      at,
      finishesAt: finishes_at,
      lowAt: low === null ? null : Math.round(at + low * 1000),
      highAt: high === null ? null : Math.round(at + high * 1000),
      completionTokensEstimate: completion_tokens_estimate,
      fraction: point.fraction,
    });
  });
}

/** A run's forecast history, oldest first (a few hundred rows at most: see runner/forecasts.ts). */
export async function forecastHistory(db: DbOrTx, runId: string) {
  const { forecasts } = db.t;
  return await db.q.select().from(forecasts).where(eq(forecasts.runId, runId)).orderBy(asc(forecasts.at));
}

/**
 * A conversation run's answered requests at each position of their conversation (0-based, as
 * sample_turns.idx counts them): how many, their completion tokens and the sum of their squares
 * (for the lengths' spread; summed as numbers, not integers, which PostgreSQL would overflow past
 * 46,340 tokens), over at most `limit` of its turns, so a read costs the same on a run of millions
 * (runner/forecast-turns.ts).
 */
export async function turnLengthsByPosition(db: DbOrTx, runId: string, limit: number): Promise<PositionLengths[]> {
  const { rows } = await db.exec<{ idx: number; n: number | string; tokens: number | string | null; squares: number | string | null }>(
    `select idx, count(*) as n, sum(completion_tokens) as tokens, sum(1.0 * completion_tokens * completion_tokens) as squares
     from (select idx, completion_tokens from sample_turns where run_id = ? limit ?) as answered group by idx`,
    [runId, limit],
  );
  const out: PositionLengths[] = [];
  for (const r of rows) out[r.idx] = { n: Number(r.n), tokens: Number(r.tokens ?? 0), squares: Number(r.squares ?? 0) };
  return Array.from(out, (p) => p ?? { n: 0, tokens: 0, squares: 0 });
}

/** The answered requests at one position: how many, their completion tokens and those tokens' squares summed. */
export interface PositionLengths {
  n: number;
  tokens: number;
  squares: number;
}

/** The requests (JSON) of a run's calibration slice: a random sample of its conversations, a few hundred at most. */
export async function calibrationRequests(db: DbOrTx, runId: string): Promise<string[]> {
  const { rows } = await db.exec<{ request: string }>(`select request from ${sliceFrom(db.dialect)}`, [runId]);
  return rows.map((r) => r.request);
}

/**
 * The statement behind underwayConversations. SQLite's planner takes the claim index for its second
 * arm, and so walks every pending sample of the run (millions at a large run's start) to find the
 * few between turns: the index is named, as the claim names it (db/samples.ts).
 */
export function underwaySql(dialect: DbOrTx['dialect']): string {
  const betweenTurns = dialect === 'pg' ? 'samples' : 'samples indexed by samples_underway_idx';
  return `select id, turn from samples where run_id = ? and status = 'in_progress'
     union all select id, turn from ${betweenTurns} where run_id = ? and status = 'pending' and turn > 0`;
}

/**
 * The conversations under way: a turn claimed or in flight (in_progress), or answered up to a
 * turn and waiting for the next (pending past turn 0): their ids and the request each is at (0-based).
 */
export async function underwayConversations(db: DbOrTx, runId: string): Promise<{ id: number; turn: number }[]> {
  const { rows } = await db.exec<{ id: number | string; turn: number | null }>(underwaySql(db.dialect), [runId, runId]);
  return rows.map((r) => ({ id: Number(r.id), turn: r.turn ?? 0 }));
}

/** The requests (JSON) of these samples, by id. */
export async function requestsOf(db: DbOrTx, ids: readonly number[]): Promise<Map<number, string>> {
  const out = new Map<number, string>();
  for (let i = 0; i < ids.length; i += IDS_PER_STATEMENT) {
    const chunk = ids.slice(i, i + IDS_PER_STATEMENT);
    const { rows } = await db.exec<{ id: number | string; request: string }>(
      `select id, request from samples where id in (${chunk.map(() => '?').join(', ')})`,
      chunk,
    );
    for (const r of rows) out.set(Number(r.id), r.request);
  }
  return out;
}
