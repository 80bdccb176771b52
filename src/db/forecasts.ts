import { asc, eq } from 'drizzle-orm';
import type { DbOrTx } from './client.js';
import type { StoredForecast } from '../domain/forecast.js';

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
