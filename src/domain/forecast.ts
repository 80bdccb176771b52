// The forecast: how many tokens a run will generate, how long it will take on the fleet, and how
// sure that is. Pure: the runner gathers the figures (runner/forecasts.ts), the API renders them.

/**
 * The calibration slice a run gets unless it asks otherwise. 200 answers put the standard error of
 * the mean length near 7% even for reasoning lengths whose spread equals their mean (1/√200), well
 * inside the bootstrap interval an operator plans with, and they take one to three waves of a
 * typical fleet (caps of 64 to 256 in flight), so the forecast comes within the run's first minutes.
 */
export const DEFAULT_CALIBRATION_SAMPLES = 200;
/** The largest slice a run may ask for: its lengths are kept in memory and resampled at every forecast. */
export const MAX_CALIBRATION_SAMPLES = 10_000;
/** Bootstrap resamples of the slice's lengths behind low/high: enough for steady 5th and 95th percentiles. */
export const BOOTSTRAP_RESAMPLES = 500;
/** The interval's quantiles: a 90% interval. */
export const LOW_QUANTILE = 0.05;
export const HIGH_QUANTILE = 0.95;
/**
 * Past this many lengths the interval comes from the normal approximation of the mean (the
 * central limit theorem holds well by then, even for heavy-tailed lengths) instead of the
 * bootstrap, whose cost is resamples × lengths draws every second: 5M for a 10,000-sample slice.
 */
export const BOOTSTRAP_MAX_LENGTHS = 1000;
/** The standard normal's 95th percentile: mean ± Z_90 × standard error is a 90% interval. */
const Z_90 = 1.6449;
/**
 * Fewest slice answers the remaining samples' mean rests on: once fewer lie ahead of the dispatch
 * frontier, the nearest ones behind it make up the number.
 */
export const MIN_AHEAD = 10;

/**
 * Characters a token, to read an old answer's length in tokens: about four for English text under
 * the BPE tokenizers of the Qwen and Llama families (and what the simulator counts). Only the
 * ranking of samples by length rests on it, not the forecast.
 */
export const CHARS_PER_TOKEN = 4;

/** 32-bit FNV-1a: a stable seed from a run id, so a restart picks the same slice. */
function hash(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** mulberry32: a small generator of 32 bits of state, uniform on [0, 1). */
export function mulberry32(state: number): () => number {
  let a = state >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** mulberry32 seeded from a text (its FNV-1a hash): the same seed, the same draws. */
export function seededRandom(seed: string): () => number {
  return mulberry32(hash(seed));
}

/**
 * The slice's input positions: the input cut into `k` equal strata, one uniformly random position
 * in each, so the slice covers the whole input however it is ordered (by source, length,
 * difficulty). Seeded from the run id: the same run always gets the same slice.
 */
export function calibrationSeqs(runId: string, total: number, k: number): number[] {
  const n = Math.min(k, total);
  const random = seededRandom(runId);
  const seqs: number[] = [];
  for (let i = 0; i < n; i++) {
    const from = Math.floor((i * total) / n);
    const to = Math.floor(((i + 1) * total) / n);
    seqs.push(from + Math.floor(random() * (to - from)));
  }
  return seqs;
}

/** A slice answer: [input position, completion tokens, its variant's index (absent or null without variants)]. */
export type SliceLength = readonly [seq: number, tokens: number, variant?: number | null];

/**
 * The slice's input positions when each line makes `perLine` samples at consecutive positions
 * (params.n): whole lines, about `k` samples' worth, drawn as calibrationSeqs draws positions. A
 * line's answers go out as one request, so a slice of single answers would send the others along
 * with them, scattered over the input and outside the slice.
 */
export function calibrationLines(runId: string, total: number, k: number, perLine: number): number[] {
  if (perLine === 1) return calibrationSeqs(runId, total, k);
  return calibrationSeqs(runId, total / perLine, Math.ceil(k / perLine)).flatMap((line) => Array.from({ length: perLine }, (_, i) => line * perLine + i));
}

/** What the forecast is made from. */
export interface ForecastInput {
  /** The whole input is forecast as if not started (a dry run); otherwise what is left of it. */
  whole: boolean;
  total: number;
  /** Samples not yet terminal (pending and in flight). */
  remaining: number;
  /** Completion tokens generated so far. */
  completionTokens: number;
  /** The slice's answered samples as [input position, completion tokens, variant index or null], in input order. */
  slice: readonly SliceLength[];
  /** Each variant's share of the samples, by index; null or absent for a run without variants. */
  variantShares?: readonly number[] | null;
  /** Slice samples not answered yet: until MIN_AHEAD are, there is no forecast. */
  sliceOpen: number;
  /** The furthest input position dispatched outside the slice (-1 before any): what lies beyond is all still to do. */
  frontier: number;
  /** The fleet's completion tokens a second for this run, each endpoint at its cap; 0 when not measured yet. */
  tokensPerSecond: number;
  /** Endpoints behind that rate. */
  endpoints: number;
  elapsedSeconds: number;
  deadlineSeconds: number | null;
  now: number;
  /**
   * A conversation run: how long its conversations ahead take on the fleet's slots, in seconds
   * (a conversation's turns run one after another, each asked once the one before is answered, so
   * the fleet idles once fewer conversations are left than it has slots: domain/forecast-chains.ts).
   * The run takes no less, whatever the fleet's rate.
   */
  chainSeconds?: number;
  /**
   * A conversation run (`regenerate: "all_assistant"`): its requests. What is left is counted in
   * turns still to ask (a conversation under way has only its later turns left), each of the
   * answered turns' mean length at its position in its conversation (`positions`), so the forecast
   * moves with every turn, not only when whole conversations end; `based_on_samples` then counts
   * the answered turns.
   */
  turns?: { left: number; answered: number; tokens: number; positions?: TurnPositions };
}

/**
 * Where a conversation run's turns fall: `lengths[k]`, the answered requests at position k of
 * their conversation (0-based) and their completion tokens, read every so often (their shape
 * changes slowly; the level comes from the run's own counters, always fresh); `ahead[k]`, how many
 * requests at position k are still to ask, expected (conversations not started count at the
 * calibration slice's share of conversations that reach k).
 */
export interface TurnPositions {
  lengths: readonly { n: number; tokens: number }[];
  ahead: readonly number[];
}

/**
 * Answers of the mean of all turns each position's mean is shrunk with: a position few
 * conversations have reached yet leans on the mean of all, not on its one or two answers, and one
 * with hundreds stands on its own (at 10, a position of 90 answers keeps 90% of its own mean).
 */
export const POSITION_PRIOR_TURNS = 10;

/**
 * The expected completion tokens of a request at each position: its answered turns' mean, shrunk
 * towards the mean of all of them, as a share of that mean (1 for a position as long as the rest).
 */
export function positionShares(lengths: readonly { n: number; tokens: number }[]): number[] {
  let n = 0;
  let tokens = 0;
  for (const p of lengths) {
    n += p.n;
    tokens += p.tokens;
  }
  if (n === 0 || tokens <= 0) return lengths.map(() => 1);
  const all = tokens / n;
  return lengths.map((p) => (p.tokens + POSITION_PRIOR_TURNS * all) / (p.n + POSITION_PRIOR_TURNS) / all);
}

/**
 * The mean length of the turns ahead as a share of the answered turns' mean: each position's share
 * weighed by the requests expected ahead at it. 1 without positions, or with nothing learned yet.
 */
export function aheadShare(positions: TurnPositions | undefined): number {
  if (!positions) return 1;
  const shares = positionShares(positions.lengths);
  let weight = 0;
  let sum = 0;
  for (const [k, count] of positions.ahead.entries()) {
    if (count <= 0) continue;
    weight += count;
    sum += count * (shares[k] ?? 1);
  }
  return weight > 0 ? sum / weight : 1;
}

/** The forecast as the runner stores it (timestamps in ms); the API renders it. */
export interface StoredForecast {
  at: number;
  based_on_samples: number;
  completion_tokens_estimate: number;
  completion_tokens_remaining: number;
  wall_seconds_estimate: number | null;
  wall_seconds_remaining: number | null;
  low: number | null;
  high: number | null;
  finishes_at: number | null;
  endpoints_for_deadline: number | null;
  fleet: { endpoints: number; completion_tokens_per_second: number };
}

/**
 * The slice answers that stand for the samples still to do: those beyond the dispatch frontier,
 * one per stratum there, so a random sample of what is left even when the input is ordered; at
 * least MIN_AHEAD of them, the nearest behind the frontier making up the number.
 */
export function aheadOf(slice: readonly SliceLength[], frontier: number): number[] {
  return aheadEntries(slice, frontier).map(([, tokens]) => tokens);
}

function aheadEntries(slice: readonly SliceLength[], frontier: number): readonly SliceLength[] {
  let lo = 0;
  let hi = slice.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (slice[mid][0] <= frontier) lo = mid + 1;
    else hi = mid;
  }
  const from = Math.max(0, Math.min(lo, slice.length - MIN_AHEAD));
  return slice.slice(from);
}

/**
 * The mean length of the samples left when they come in variants of different lengths: each
 * variant's mean over its own slice answers, weighted by its share of the samples (a variant with
 * none ahead takes the mean of all). The slice is a random sample of custom ids, so its mix of
 * variants is their shares only on average; this takes out the error of a slice that holds, by
 * chance, too many of the long variant or too few.
 */
export function variantMean(ahead: readonly SliceLength[], shares: readonly number[]): number {
  const all = mean(ahead.map(([, tokens]) => tokens));
  const sums = shares.map(() => ({ tokens: 0, n: 0 }));
  for (const [, tokens, variant] of ahead) {
    const s = variant === null || variant === undefined ? undefined : sums[variant];
    if (!s) continue;
    s.tokens += tokens;
    s.n++;
  }
  return shares.reduce((t, share, v) => t + share * (sums[v]!.n ? sums[v]!.tokens / sums[v]!.n : all), 0);
}

/** Seconds to a tenth: a test run takes seconds, a real one days. */
const tenths = (s: number) => Math.round(s * 10) / 10;

const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

/** The 5th and 95th percentiles of the mean of `lengths`, over BOOTSTRAP_RESAMPLES resamples with replacement. */
export function bootstrapMean(lengths: readonly number[], random: () => number): { low: number; high: number } {
  const n = lengths.length;
  if (n > BOOTSTRAP_MAX_LENGTHS) {
    let sum = 0;
    let squares = 0;
    for (const x of lengths) {
      sum += x;
      squares += x * x;
    }
    const m = sum / n;
    const standardError = Math.sqrt(Math.max(0, squares / n - m * m) / (n - 1));
    return { low: m - Z_90 * standardError, high: m + Z_90 * standardError };
  }
  const means = new Float64Array(BOOTSTRAP_RESAMPLES);
  for (let b = 0; b < BOOTSTRAP_RESAMPLES; b++) {
    let sum = 0;
    for (let i = 0; i < n; i++) sum += lengths[Math.floor(random() * n)];
    means[b] = sum / n;
  }
  means.sort();
  const at = (q: number) => means[Math.min(BOOTSTRAP_RESAMPLES - 1, Math.floor(q * BOOTSTRAP_RESAMPLES))];
  return { low: at(LOW_QUANTILE), high: at(HIGH_QUANTILE) };
}

/**
 * The forecast, or null while there is nothing to base it on (fewer than MIN_AHEAD slice answers
 * while the slice is being answered, or no completion).
 * Remaining tokens are the samples left times the mean length of the slice answers ahead of the
 * frontier (the completed in-order samples are not used for it: in an ordered input they are a
 * biased sample); without a slice, the mean of everything completed stands in, with no interval.
 * Wall time is remaining tokens over the fleet's measured token rate at its caps.
 */
export function computeForecast(f: ForecastInput, random: () => number): StoredForecast | null {
  // A conversation run's answered turns are a basis before whole conversations are: a small run's
  // slice is its whole input, and its first conversations end only near its own end.
  const turns = f.turns && f.turns.answered >= MIN_AHEAD && f.turns.tokens > 0 ? f.turns : null;
  if (f.sliceOpen > 0 && f.slice.length < MIN_AHEAD && !turns) return null;
  const done = f.whole ? 0 : f.completionTokens;
  const left = f.whole ? f.total : f.remaining;
  const entries = aheadEntries(f.slice, f.whole ? -1 : f.frontier);
  const ahead = entries.map(([, tokens]) => tokens);
  let meanLength: number;
  let band: { low: number; high: number } | null = null;
  let basedOn: number;
  if (ahead.length > 0) {
    meanLength = mean(ahead);
    band = bootstrapMean(ahead, random);
    if (f.variantShares?.length) {
      // Weighted by the variants' shares; the interval keeps its width around the weighted mean.
      const weighted = variantMean(entries, f.variantShares);
      band = { low: band.low + weighted - meanLength, high: band.high + weighted - meanLength };
      meanLength = weighted;
    }
    // Every slice answer counts, not only those ahead: the ones behind are in the tokens done, and
    // a count that fell as the frontier passed them would read as the forecast losing its basis.
    basedOn = f.slice.length;
  } else {
    const completed = f.total - f.remaining;
    if ((completed <= 0 || f.completionTokens <= 0) && !turns) return null;
    meanLength = completed > 0 ? f.completionTokens / completed : 0;
    basedOn = completed;
  }
  // Per turn for a conversation run: the slice's band keeps its relative width.
  const units = turns ? Math.max(0, turns.left) : left;
  // A conversation's later turns may run longer or shorter than its first: the turns ahead are
  // weighed by where they fall in their conversations.
  const perUnit = turns ? (turns.tokens / turns.answered) * aheadShare(turns.positions) : meanLength;
  if (turns) {
    band = band && meanLength > 0 ? { low: (band.low / meanLength) * perUnit, high: (band.high / meanLength) * perUnit } : null;
    basedOn = turns.answered;
  }
  const tokensLeft = left === 0 ? 0 : units * perUnit;
  const rate = f.tokensPerSecond;
  // Nothing left takes no time, whatever the fleet: a run settling while no endpoint is up still ends.
  const chain = f.chainSeconds ?? 0;
  const wall = (tokens: number) => (tokens === 0 ? 0 : rate > 0 ? Math.max(tokens / rate, chain) : null);
  const remaining = wall(tokensLeft);
  const elapsed = f.whole ? 0 : f.elapsedSeconds;
  let endpointsForDeadline: number | null = null;
  if (f.deadlineSeconds !== null && rate > 0 && f.endpoints > 0) {
    const timeLeft = f.deadlineSeconds - elapsed;
    const perEndpoint = rate / f.endpoints;
    if (timeLeft > 0) endpointsForDeadline = Math.max(1, Math.ceil(tokensLeft / perEndpoint / timeLeft));
  }
  return {
    at: f.now,
    based_on_samples: basedOn,
    completion_tokens_estimate: Math.round(done + tokensLeft),
    completion_tokens_remaining: Math.round(tokensLeft),
    wall_seconds_estimate: remaining === null ? null : tenths(elapsed + remaining),
    wall_seconds_remaining: remaining === null ? null : tenths(remaining),
    low: remaining === null ? null : tenths(band ? wall(units * band.low)! : remaining),
    high: remaining === null ? null : tenths(band ? wall(units * band.high)! : remaining),
    finishes_at: remaining === null ? null : Math.round(f.now + remaining * 1000),
    endpoints_for_deadline: endpointsForDeadline,
    fleet: { endpoints: f.endpoints, completion_tokens_per_second: Math.round(rate) },
  };
}
