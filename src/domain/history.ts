/**
 * The throughput history the server keeps, for the fleet and for each run: one point per span of
 * time with what was answered in it (counts, so a merged point's rate is the exact average of the
 * points it replaces) and, for the fleet, the requests in flight and the caps over it.
 *
 * Points thin out as they age: one every 5 s for the last hour, one a minute for the last day, one
 * every 10 minutes before that. A series then holds at most 720 + 1,440 points plus 144 for each
 * day past the first: under HISTORY_POINTS_30_DAYS for a run of 30 days (test/unit/history.test.ts
 * simulates one).
 */

export interface HistoryTier {
  /** How long one point of this tier covers, ms. */
  stepMs: number;
  /** How long points stay at this resolution before they are merged into the next tier's. */
  keepMs: number;
}

const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;

/** Finest first; the last tier keeps its points for good. */
export const HISTORY_TIERS: readonly HistoryTier[] = [
  { stepMs: 5_000, keepMs: HOUR_MS },
  { stepMs: 60_000, keepMs: DAY_MS },
  { stepMs: 600_000, keepMs: Number.POSITIVE_INFINITY },
];

/** The recorder's period: the finest tier's step. */
export const HISTORY_STEP_MS = HISTORY_TIERS[0].stepMs;

/** 720 (an hour of 5 s) + 1,440 (a day of minutes) + 29 × 144 (10-minute points) = 6,336, with room for a compaction's lag. */
export const HISTORY_POINTS_30_DAYS = 6_500;

/** Requests in flight and the cap of one endpoint, averaged over a point's span. */
export type EndpointLoad = [inFlight: number, cap: number];

export interface HistoryPoint {
  /** Start of the span, ms since the epoch. */
  at: number;
  /** The tier's step this point belongs to (HISTORY_TIERS). */
  stepMs: number;
  /** The time the point covers: its step, or less when the recorder was not running for part of it. */
  spanMs: number;
  /** Samples completed within the span. */
  samples: number;
  completionTokens: number;
  promptTokens: number;
  /** Prompt tokens the servers found in their prefix cache, where they report it. */
  cachedTokens: number;
  /** Fleet only (null on a run's): requests sent and not yet answered, and the sum of the caps. */
  inFlight: number | null;
  cap: number | null;
  /** Fleet only: each endpoint's in flight and cap. */
  endpoints: Record<string, EndpointLoad> | null;
}

/** Rates of a point: per second of its span; the hit rate is null where no prompt token was counted. */
export function pointRates(p: HistoryPoint) {
  const seconds = Math.max(1, p.spanMs) / 1000;
  return {
    samplesPerSecond: p.samples / seconds,
    completionTokensPerSecond: p.completionTokens / seconds,
    cacheHitRate: p.promptTokens > 0 ? p.cachedTokens / p.promptTokens : null,
  };
}

/** Averages of a gauge over the points that carry it, weighted by their spans. */
function weighted(points: readonly HistoryPoint[], value: (p: HistoryPoint) => number | null): number | null {
  let sum = 0;
  let span = 0;
  for (const p of points) {
    const v = value(p);
    if (v === null) continue;
    sum += v * p.spanMs;
    span += p.spanMs;
  }
  return span > 0 ? sum / span : null;
}

/** One point of `stepMs` starting at `at`, from the points it covers: counts summed, gauges averaged. */
function merge(at: number, stepMs: number, points: readonly HistoryPoint[]): HistoryPoint {
  const sum = (f: (p: HistoryPoint) => number) => points.reduce((s, p) => s + f(p), 0);
  let endpoints: Record<string, EndpointLoad> | null = null;
  const ids = new Set(points.flatMap((p) => Object.keys(p.endpoints ?? {})));
  if (ids.size) {
    endpoints = {};
    for (const id of ids) {
      const inFlight = weighted(points, (p) => p.endpoints?.[id]?.[0] ?? null) ?? 0;
      const cap = weighted(points, (p) => p.endpoints?.[id]?.[1] ?? null) ?? 0;
      endpoints[id] = [inFlight, cap];
    }
  }
  return {
    at,
    stepMs,
    spanMs: sum((p) => p.spanMs),
    samples: sum((p) => p.samples),
    completionTokens: sum((p) => p.completionTokens),
    promptTokens: sum((p) => p.promptTokens),
    cachedTokens: sum((p) => p.cachedTokens),
    inFlight: weighted(points, (p) => p.inFlight),
    cap: weighted(points, (p) => p.cap),
    endpoints,
  };
}

/**
 * The points of one series that have aged out of their tier at `now`: those older than the tier's
 * keep, up to a whole bucket of the next tier (a bucket is merged once, never in two parts).
 */
export function agedOut(tier: number, now: number): { stepMs: number; before: number } {
  const next = HISTORY_TIERS[tier + 1];
  return { stepMs: HISTORY_TIERS[tier].stepMs, before: Math.floor((now - HISTORY_TIERS[tier].keepMs) / next.stepMs) * next.stepMs };
}

/**
 * One series after aging at `now`: each tier's aged points merged into its next tier's buckets.
 * Points that did not age are returned as they were (the same objects), oldest first.
 */
export function compactSeries(points: readonly HistoryPoint[], now: number): HistoryPoint[] {
  let series = [...points];
  for (let tier = 0; tier < HISTORY_TIERS.length - 1; tier++) {
    const { stepMs, before } = agedOut(tier, now);
    const next = HISTORY_TIERS[tier + 1].stepMs;
    const buckets = new Map<number, HistoryPoint[]>();
    const kept: HistoryPoint[] = [];
    for (const p of series) {
      if (p.stepMs !== stepMs || p.at >= before) {
        kept.push(p);
        continue;
      }
      const at = Math.floor(p.at / next) * next;
      const bucket = buckets.get(at);
      if (bucket) bucket.push(p);
      else buckets.set(at, [p]);
    }
    series = [...kept, ...[...buckets].map(([at, ps]) => merge(at, next, ps))];
  }
  return series.sort((a, b) => a.at - b.at);
}

/** The most points one answer of a history route holds (README "History"): a month of a run at 5 s would be 500,000. */
export const HISTORY_MAX_POINTS = 2_000;

/**
 * A series read at `stepMs`: its points merged into buckets of that step (counts summed, gauges
 * averaged over their spans). A point already coarser than the step stays as it is, and a bucket of
 * one point keeps it unchanged.
 */
export function resample(points: readonly HistoryPoint[], stepMs: number): HistoryPoint[] {
  const buckets = new Map<number, HistoryPoint[]>();
  for (const p of points) {
    const at = Math.floor(p.at / stepMs) * stepMs;
    const bucket = buckets.get(at);
    if (bucket) bucket.push(p);
    else buckets.set(at, [p]);
  }
  return [...buckets].map(([at, ps]) => (ps.length === 1 ? ps[0] : merge(at, stepMs, ps))).sort((a, b) => a.at - b.at);
}

/**
 * The step a range is read at when none is asked for: the finest multiple of the recorder's step
 * that keeps the answer within HISTORY_MAX_POINTS.
 */
export function fittingStepMs(fromMs: number, toMs: number): number {
  // Buckets of a step over a range number at most range / step + 1: one point is the alignment's.
  const needed = Math.ceil(Math.max(0, toMs - fromMs) / (HISTORY_MAX_POINTS - 1));
  return Math.max(1, Math.ceil(needed / HISTORY_STEP_MS)) * HISTORY_STEP_MS;
}
