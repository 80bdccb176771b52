import { describe, expect, it } from 'vitest';
import { compactSeries, HISTORY_POINTS_30_DAYS, HISTORY_STEP_MS, HISTORY_TIERS, pointRates, type HistoryPoint } from '../../src/domain/history.js';

const DAY_MS = 86_400_000;
/** How often the simulated recorder compacts: the real one does so every minute; coarser keeps the test quick and the bound must hold anyway. */
const COMPACT_EVERY_MS = 10 * 60_000;

const point = (at: number, samples: number, inFlight: number): HistoryPoint => ({
  at,
  stepMs: HISTORY_STEP_MS,
  spanMs: HISTORY_STEP_MS,
  samples,
  completionTokens: samples * 100,
  promptTokens: samples * 50,
  cachedTokens: samples * 10,
  inFlight,
  cap: 64,
  endpoints: { ep_a: [inFlight, 64] },
});

describe('the history series', () => {
  it('stays under its bound over a simulated 30-day run and loses no answer', () => {
    let series: HistoryPoint[] = [];
    let largest = 0;
    let answered = 0;
    const end = 30 * DAY_MS;
    for (let t = 0; t < end; t += HISTORY_STEP_MS) {
      const samples = (t / HISTORY_STEP_MS) % 7;
      answered += samples;
      series.push(point(t, samples, 40));
      if ((t + HISTORY_STEP_MS) % COMPACT_EVERY_MS === 0) series = compactSeries(series, t + HISTORY_STEP_MS);
      largest = Math.max(largest, series.length);
    }
    expect(largest).toBeLessThan(HISTORY_POINTS_30_DAYS);
    expect(series.reduce((s, p) => s + p.samples, 0)).toBe(answered);
    // Each tier holds what its age says: 5 s for the last hour, minutes for the day, 10 minutes before.
    const now = end;
    for (const p of series) {
      const age = now - p.at;
      const tier = HISTORY_TIERS.findIndex((x) => x.stepMs === p.stepMs);
      expect(tier).toBeGreaterThanOrEqual(0);
      if (tier > 0) expect(age).toBeGreaterThan(HISTORY_TIERS[tier - 1].keepMs);
    }
    expect(series.filter((p) => p.stepMs === 600_000).length).toBeGreaterThan(28 * 144);
  });

  it('merges counts exactly and averages gauges by span', () => {
    const merged = compactSeries([point(0, 10, 20), point(5_000, 30, 60)], 2 * 3_600_000);
    expect(merged).toHaveLength(1);
    const [m] = merged;
    expect(m).toMatchObject({ at: 0, stepMs: 60_000, spanMs: 10_000, samples: 40, inFlight: 40, cap: 64, endpoints: { ep_a: [40, 64] } });
    expect(pointRates(m)).toEqual({ samplesPerSecond: 4, completionTokensPerSecond: 400, cacheHitRate: 0.2 });
  });

  it('leaves a bucket whole until all of it has aged', () => {
    // At 1 h 0 min 30 s, the points of the first minute have aged but the second minute's bucket is partly young.
    const series = [0, 30_000, 60_000, 65_000].map((at) => point(at, 1, 1));
    const after = compactSeries(series, 3_600_000 + 61_000);
    expect(after.map((p) => [p.at, p.stepMs])).toEqual([
      [0, 60_000],
      [60_000, 5_000],
      [65_000, 5_000],
    ]);
  });
});
