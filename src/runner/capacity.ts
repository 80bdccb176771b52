// How many requests regen keeps in flight on an endpoint (docs/design.md "Runner",
// docs/sglang.md "Capacity").
//
// SGLang's own tuning guide asks for a large running batch with a waiting queue behind it, KV
// token usage above 0.9, and retractions rare. Its advertised running limit is no guide: by default
// it is 2048 or more per data-parallel rank, far past what the KV pool holds, and past the KV
// budget requests are retracted and re-prefilled, which costs more than it gains. So the cap is
// steered from the server's live load: grown while the KV pool has room for its requests at their
// largest and the queue is short, held once the pool is full with a queue in its band, and cut back
// when the server retracts.

import type { ServerCapacity } from '../domain/concurrency.js';

export type { CapSource, ServerCapacity } from '../domain/concurrency.js';

/** One reading of the server's live load, summed over its DP ranks. */
export interface Load {
  at: number;
  running: number;
  waiting: number;
  /** Used over total KV tokens, 0 to 1; null when the server does not say. */
  tokenUsage: number | null;
  /** Requests retracted since the server started (a counter); null when the server does not say. */
  retracted: number | null;
  /** Retracted requests waiting to run again now (a gauge), where the server gives no counter. */
  retractedNow?: number | null;
  /** The server's prefix-cache hit rate (`cache_hit_rate`, mean over its DP ranks), 0 to 1; null or absent when it does not say. */
  cacheHitRate?: number | null;
}

/** Where the adaptive cap starts: enough to fill a small server at once, low enough not to flood a KV pool before the first reading. */
const START_CAP = 64;
/**
 * A small KV pool starts lower: at one request per this many tokens of it (a reasoning answer's
 * length), so that the first requests, sent together and ending together, do not overflow it, and
 * the cap's growth, a few at each reading, spreads the requests' ends over their lifetime: requests
 * that keep their phase, each replaced as it ends, hold at most what they held at their fullest
 * moment. In a model of the adaptive bench (test/support/kv-dispatch.ts), starting at 5 instead of
 * 20 settled the cap at 78–85 instead of 67–84 in 36 two-minute runs, neither retracting.
 */
const START_TOKENS_PER_REQUEST = 4000;
const MIN_CAP = 4;
/** Growth per reading in the first request lifetime, while the KV pool is less than FIRST_LIFETIME_USAGE used. */
const GROWTH = 1.25;
/**
 * In the first lifetime the requests hold only their prompt and the start of their answer: usage
 * then says little of what they will hold at their end, so the cap stops growing at a quarter of the pool.
 */
const FIRST_LIFETIME_USAGE = 0.25;
/** Growth per reading once a lifetime is known: small steps, so that requests added together do not end together. */
const STEP = 0.05;
/** The cut when the server retracts: below the level that made it retract. */
const BACKOFF = 0.85;
/** KV usage at which the pool counts as full (SGLang's guide: above 0.9). */
const FULL_TOKEN_USAGE = 0.9;
/**
 * The KV usage the cap aims for at the largest share a request held: short of full, since readings
 * a few hundred milliseconds apart miss the top of each request's growth (at 0.85 the model of the
 * adaptive bench retracted in 4 of 36 two-minute runs, at 0.8 in none).
 */
const FIT_TOKEN_USAGE = 0.8;
/** Retractions the guide calls rare: about one a minute. */
const RARE_RETRACTIONS_PER_MS = 1 / 60_000;
/** How long a level that made the server retract is remembered before it is tried again. */
const KNEE_MEMORY_MS = 60_000;
/**
 * The lifetimes the largest share is taken over. Readings a few hundred milliseconds apart can miss
 * the top of a request's growth by a reading's worth of tokens, most when the server is loaded and
 * they come late; each lifetime they fall at other moments of the requests' lives, so over several
 * their largest comes close to the top. In a model of the adaptive bench (the simulator's KV rank
 * in virtual time, as test/support/kv-dispatch.ts) with readings 250–500 ms apart, the pool
 * overflowed in 12 of 18 two-minute runs over one lifetime, and in none over four.
 */
const SHARE_LIFETIMES = 4;
/**
 * The most readings the largest share is taken over: an hour at the default interval of a second,
 * and a bound on what is kept while no answer has come back to tell a lifetime.
 */
const MAX_SHARES = 3600;
/** In-flight share of the cap at which regen, not its supply of samples, is what limits the server. */
const SATURATED = 0.95;
/**
 * SGLang's recommended waiting queue is 100 to 2000; smaller servers get a proportionally shorter
 * one, half their running batch: answers of like length end together, and a queue that holds half
 * a batch refills those slots at once where an eighth left them idle for regen's turnover of the
 * burst (30–200 ms measured, 4 servers × 64 slots, 1 s answers; BENCHMARKS.md 2026-12-06, pace).
 */
const QUEUE_LOW_MAX = 100;
const QUEUE_HIGH_MAX = 2000;
const QUEUE_MIN = 4;

/** The waiting queue the cap aims for on a server running `running` requests. */
export function queueBand(running: number): { low: number; high: number } {
  const low = Math.max(QUEUE_MIN, Math.min(QUEUE_LOW_MAX, Math.ceil(running / 2)));
  const high = Math.max(2 * low, Math.min(QUEUE_HIGH_MAX, running));
  return { low, high };
}

/**
 * The adaptive cap of one endpoint. `observe` takes each new load reading with the requests regen
 * has in flight there and how long one takes there (the median answer's latency, null before the
 * first answer); the cap never exceeds what the server can run plus a short queue, nor an
 * operator's max_concurrency.
 *
 * Past the first lifetime of its requests, the cap grows only as far as the KV pool holds every
 * request at the largest share of it one held over the last lifetimes: a request's KV grows until
 * its answer ends, so the usage read now says what the pool holds at its fullest only once the
 * requests sent at the last change have lived a lifetime. Requests added together end together, so
 * near that limit it grows a few at a time: added in one burst they would fill the pool at once at
 * their end, where spread over a lifetime they hold half their largest share on average.
 */
export class AdaptiveCap {
  private value: number;
  private last: Load | null = null;
  private firstAt: number | null = null;
  /** When the cap was last cut for a retraction. */
  private cutAt: number | null = null;
  /** The KV share of one running request at each reading over the last SHARE_LIFETIMES lifetimes. */
  private shares: { at: number; share: number }[] = [];
  /** The in-flight level at which the server last retracted, and when. */
  private knee: { level: number; at: number } | null = null;

  constructor(
    private ceiling: number,
    private server: ServerCapacity = { maxRunning: null, kvTokens: null },
  ) {
    const { kvTokens } = server;
    const start = kvTokens === null ? START_CAP : Math.min(START_CAP, Math.floor(kvTokens / START_TOKENS_PER_REQUEST));
    this.value = Math.max(MIN_CAP, Math.min(ceiling, start));
  }

  get cap(): number {
    return this.value;
  }

  /** The server's capacity changed (a restart, a new launch flag), or the operator's ceiling did. */
  setCeiling(ceiling: number, server: ServerCapacity = this.server): void {
    this.server = server;
    this.ceiling = Math.max(MIN_CAP, ceiling);
    this.value = Math.min(this.value, this.ceiling);
  }

  observe(load: Load, inFlight: number, lifetimeMs: number | null = null): void {
    const prev = this.last;
    this.last = load;
    this.firstAt ??= load.at;
    if (this.knee && load.at - this.knee.at > KNEE_MEMORY_MS) this.knee = null;
    if (load.tokenUsage !== null && load.running > 0) this.shares.push({ at: load.at, share: load.tokenUsage / load.running });
    if (lifetimeMs !== null) this.shares = this.shares.filter((s) => load.at - s.at <= SHARE_LIFETIMES * lifetimeMs);
    if (this.shares.length > MAX_SHARES) this.shares.shift();
    const elapsed = prev ? Math.max(1, load.at - prev.at) : 1;
    const band = queueBand(load.running);
    let next = this.value;
    if (retracting(prev, load, elapsed)) {
      const level = Math.min(this.value, inFlight);
      this.knee = { level, at: load.at };
      this.cutAt = load.at;
      next = Math.floor(level * BACKOFF);
    } else if (load.waiting > band.high) {
      next = this.value - (load.waiting - band.high);
    } else if (inFlight >= this.value * SATURATED && load.waiting < band.low && !retractedAny(prev, load)) {
      next = this.grown(prev, load, band.low, lifetimeMs);
      if (this.knee) next = Math.min(next, this.knee.level - 1);
      next = Math.max(next, this.value);
    }
    this.value = Math.max(MIN_CAP, Math.min(this.ceiling, next));
  }

  private grown(prev: Load | null, load: Load, queueLow: number, lifetimeMs: number | null): number {
    const step = this.value + Math.max(1, Math.ceil(this.value * STEP));
    const queued = this.value + (queueLow - load.waiting);
    // A server at its running limit holds the rest back for sure: its queue grows to its band at once.
    if (this.server.maxRunning !== null && load.running >= this.server.maxRunning) return queued;
    if (load.tokenUsage === null) return Math.ceil(this.value * GROWTH);
    // A full pool with a queue at two readings in a row: SGLang holds back what its pool cannot take
    // (a request caught between two of its steps is seldom seen twice); only the queue grows, a few at a time.
    if (load.tokenUsage >= FULL_TOKEN_USAGE) return load.waiting > 0 && (prev?.waiting ?? 0) > 0 ? Math.min(queued, step) : this.value;
    if (lifetimeMs === null || load.at - this.firstAt! < lifetimeMs) {
      return load.tokenUsage < FIRST_LIFETIME_USAGE ? Math.ceil(this.value * GROWTH) : this.value;
    }
    // The server's answer to a cut is seen only once the requests it let in have lived their lifetime.
    if (this.cutAt !== null && load.at - this.cutAt < lifetimeMs) return this.value;
    const worst = Math.max(...this.shares.map((s) => s.share));
    const fit = worst > 0 ? Math.floor(FIT_TOKEN_USAGE / worst) : this.ceiling;
    // Far from that limit, grow as in the first lifetime; near it, a few at a time.
    return Math.min(fit, fit >= 2 * this.value ? Math.ceil(this.value * GROWTH) : step);
  }
}

/** Any retraction since the last reading: no time to grow, whose queue holds the retracted requests. */
function retractedAny(prev: Load | null, load: Load): boolean {
  if (load.retracted === null) return (load.retractedNow ?? 0) > 0;
  return prev !== null && prev.retracted !== null && load.retracted > prev.retracted;
}

/** More retractions since the last reading than the guide calls rare. */
function retracting(prev: Load | null, load: Load, elapsedMs: number): boolean {
  // Without a counter, only a gauge that rises says the server retracts again; one that stays up
  // is the same retracted requests waiting to run.
  if (load.retracted === null) return (load.retractedNow ?? 0) > (prev?.retractedNow ?? 0);
  if (!prev || prev.retracted === null) return false;
  return load.retracted - prev.retracted > Math.max(1, elapsedMs * RARE_RETRACTIONS_PER_MS);
}

/** The most regen sends a server that can run `maxRunning`: that, plus the low end of the queue band. */
export function serverCeiling(maxRunning: number): number {
  return maxRunning + queueBand(maxRunning).low;
}

/**
 * The cap of an endpoint whose server turns regen away (429, a gateway's shedding): cut below what
 * was in flight at each turn-away, as the adaptive cap is cut on retractions, and given back one
 * slot per answer, so regen settles just under what the server lets it have.
 */
export class YieldCap {
  private held: number | null = null;
  /** Turn-aways since the last answer: the backoff of one without Retry-After doubles with them. */
  private inRow = 0;

  /** The cap in use given the one the endpoint would have otherwise. */
  limit(cap: number): number {
    return this.held === null ? cap : Math.min(cap, this.held);
  }

  /** A turn-away with `inFlight` requests there under `cap`; returns the turn-aways in a row. */
  turnedAway(cap: number, inFlight: number): number {
    this.held = Math.max(1, Math.floor(Math.min(cap, inFlight) * BACKOFF));
    return ++this.inRow;
  }

  /** An answer: one slot more, until the cap is the endpoint's own again. */
  answered(cap: number): void {
    this.inRow = 0;
    if (this.held === null) return;
    this.held++;
    if (this.held >= cap) this.held = null;
  }
}

/**
 * regen's cap on a shared endpoint (README "Sharing servers"), from a load reading with `inFlight`
 * of regen's own there: the server's slots less others' running requests less `reserve_slots`, and
 * nothing new while others have more than `max_other_queue` waiting. No queue of regen's own is
 * kept there: others would wait behind it. regen's requests are taken to be the running ones first
 * (admitted before the others' that queue), so others' queue is what the server holds beyond them.
 */
export function sharedCap(share: { reserve_slots: number; max_other_queue: number }, slots: number, load: Load, inFlight: number): number {
  const ownRunning = Math.min(inFlight, load.running);
  const othersRunning = load.running - ownRunning;
  const othersWaiting = Math.max(0, load.waiting - (inFlight - ownRunning));
  if (othersWaiting > share.max_other_queue) return 0;
  return Math.max(0, slots - othersRunning - share.reserve_slots);
}
