// How long a conversation run's requests ahead take on the fleet's slots. A conversation's turns
// run one after another, so the time left is neither the work over the fleet's rate (the fleet
// idles once fewer conversations are left than it has slots) nor the longest chain at its mean
// length (of sixty chains of random turns, the longest runs well past the longest mean): it is the
// last of the conversations to end, found here by playing the dispatch forward with turns of
// random length, as the runner claims them, a number of times, and taking the mean.

/** What lies ahead of a conversation run. */
export interface ConversationsAhead {
  /** Of each conversation under way, the position of its next request (0-based; one in flight counts whole) and its requests in all. */
  underway: readonly { next: number; requests: number }[];
  /** Conversations not started yet. */
  unstarted: number;
  /** Requests of each conversation of the calibration slice (a random sample of the input's): those not started are drawn from it. */
  requestCounts: readonly number[];
}

export interface Fleet {
  /** Requests the fleet holds at once for the run: its endpoints' caps. */
  slots: number;
  /** Mean seconds of a request at each position of its conversation (the last one for positions past it). */
  turnSeconds: readonly number[];
  /** The spread of a request's length around its position's mean: standard deviation over mean. */
  spread: number;
}

/**
 * Requests played forward at most, over all repetitions: 8.6 ms of one core a forecast at a load
 * of 10 (60,000 took 42 ms), and a conversation run's forecast is made every second. A run with
 * more conversations left than fit plays a part of its unstarted ones (see conversationSeconds),
 * and of those under way (playable).
 */
const PLAYED_REQUESTS = 20_000;
/** Repetitions at most: the mean of 16 plays of 47 conversations of uneven turns (a spread of 0.46) varied by 3% (its standard deviation) from seed to seed. */
const REPETITIONS = 16;

/**
 * The mean time, in seconds, until the last conversation ahead ends: the dispatch played forward
 * as the runner claims (a conversation's next turn before any conversation not started), each
 * request a random length around its position's mean. Conversations not started past what can be
 * played keep every slot busy before the played ones' tail: their work is added at the fleet's
 * full rate.
 */
export function conversationSeconds(whole: ConversationsAhead, fleet: Fleet, random: () => number): number {
  const { ahead, slots } = playable(whole, Math.max(1, Math.floor(fleet.slots)));
  const counts = ahead.requestCounts.some((n) => n > 0) ? ahead.requestCounts : [1];
  const meanCount = counts.reduce((a, b) => a + b, 0) / counts.length;
  const underwayRequests = ahead.underway.reduce((n, c) => n + c.requests - c.next, 0);
  const room = Math.max(0, PLAYED_REQUESTS - underwayRequests);
  const played = Math.min(ahead.unstarted, Math.floor(room / meanCount));
  const turnSeconds = (k: number) => fleet.turnSeconds[Math.min(k, fleet.turnSeconds.length - 1)] ?? 0;
  let meanSeconds = 0;
  for (const count of counts) for (let k = 0; k < count; k++) meanSeconds += turnSeconds(k) / counts.length;
  const busy = ((ahead.unstarted - played) * meanSeconds) / slots;
  const repetitions = Math.max(1, Math.min(REPETITIONS, Math.floor(PLAYED_REQUESTS / Math.max(1, underwayRequests + played * meanCount))));
  const draw = lognormal(fleet.spread, random);
  let sum = 0;
  for (let r = 0; r < repetitions; r++) sum += playOnce(ahead.underway, played, counts, slots, (k) => turnSeconds(k) * draw(), random);
  return busy + sum / repetitions;
}

/**
 * What can be played within PLAYED_REQUESTS: more conversations under way than that (a fleet that
 * lost most of its endpoints mid-run) are played as an even part of them on the same part of the
 * slots, with the same part of those not started, which ends at about the same time.
 */
function playable(ahead: ConversationsAhead, slots: number): { ahead: ConversationsAhead; slots: number } {
  const underwayRequests = ahead.underway.reduce((n, c) => n + c.requests - c.next, 0);
  if (underwayRequests <= PLAYED_REQUESTS) return { ahead, slots };
  const every = Math.ceil(underwayRequests / PLAYED_REQUESTS);
  const underway = ahead.underway.filter((_, i) => i % every === 0);
  const part = underway.length / ahead.underway.length;
  return {
    ahead: { underway, unstarted: Math.round(ahead.unstarted * part), requestCounts: ahead.requestCounts },
    slots: Math.max(1, Math.ceil(slots * part)),
  };
}

/** One play of the dispatch: the time its last request ends. */
function playOnce(
  underway: ConversationsAhead['underway'],
  unstarted: number,
  counts: readonly number[],
  slots: number,
  seconds: (position: number) => number,
  random: () => number,
): number {
  const ends = new EndHeap();
  // Conversations whose next request waits for a slot, by their remaining [next, requests].
  const waiting: [number, number][] = [];
  for (const c of underway) if (c.next < c.requests) waiting.push([c.next, c.requests]);
  let notStarted = unstarted;
  let now = 0;
  let free = slots;
  const fill = () => {
    while (free > 0) {
      let c = waiting.pop();
      if (!c && notStarted > 0) {
        notStarted--;
        c = [0, counts[Math.floor(random() * counts.length)]];
      }
      if (!c) return;
      free--;
      ends.push(now + seconds(c[0]), c[0] + 1, c[1]);
    }
  };
  fill();
  while (ends.size > 0) {
    const [at, next, requests] = ends.pop();
    now = at;
    free++;
    if (next < requests) waiting.push([next, requests]);
    fill();
  }
  return now;
}

/** Draws of a lognormal factor of mean 1 and standard deviation `spread` (Box–Muller). */
function lognormal(spread: number, random: () => number): () => number {
  const variance = Math.log(1 + spread * spread);
  if (!(variance > 0)) return () => 1;
  const sigma = Math.sqrt(variance);
  return () => {
    const normal = Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
    return Math.exp(sigma * normal - variance / 2);
  };
}

/** A binary min-heap of requests in flight: when each ends, and its conversation's next position and requests. */
class EndHeap {
  private readonly items: [number, number, number][] = [];

  get size(): number {
    return this.items.length;
  }

  push(at: number, next: number, requests: number): void {
    const items = this.items;
    items.push([at, next, requests]);
    let i = items.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (items[parent][0] <= items[i][0]) break;
      [items[parent], items[i]] = [items[i], items[parent]];
      i = parent;
    }
  }

  pop(): [number, number, number] {
    const items = this.items;
    const top = items[0];
    const last = items.pop()!;
    if (items.length > 0) {
      items[0] = last;
      let i = 0;
      for (;;) {
        const left = 2 * i + 1;
        const right = left + 1;
        let least = i;
        if (left < items.length && items[left][0] < items[least][0]) least = left;
        if (right < items.length && items[right][0] < items[least][0]) least = right;
        if (least === i) break;
        [items[least], items[i]] = [items[i], items[least]];
        i = least;
      }
    }
    return top;
  }
}

/** Rounds of the censored mean: each moves it by less than the last, and the third is within a percent of the tenth on uneven turns. */
const CENSORED_ROUNDS = 5;

/**
 * The mean length of a run's requests, counting those still in flight: each has generated for as
 * long as it has been out, so its length is at least `bounds[i]` tokens, and the answered ones
 * alone are the short ones of those sent together (a conversation run's first turns start at once,
 * and at a third of its turns its answered ones ran 18% short of the run's mean). Each in flight
 * counts as its expected length past its bound, for lengths spread normally around the mean (a
 * censored mean, found by rounds of expectation).
 */
export function censoredMean(answered: { n: number; tokens: number }, bounds: readonly number[], spread: number): number {
  if (answered.n === 0) return 0;
  let mean = answered.tokens / answered.n;
  if (!bounds.length || !(spread > 0) || !(mean > 0)) return mean;
  for (let round = 0; round < CENSORED_ROUNDS; round++) {
    const sd = spread * mean;
    let sum = answered.tokens;
    for (const b of bounds) sum += expectedPast(mean, sd, b);
    mean = sum / (answered.n + bounds.length);
  }
  return mean;
}

/** E[X | X > b] for X normal (mean, sd): mean + sd × φ(z) / (1 − Φ(z)), z = (b − mean) / sd; b itself far in the tail. */
function expectedPast(mean: number, sd: number, b: number): number {
  const z = (b - mean) / sd;
  const tail = 1 - normalCdf(z);
  if (tail < 1e-9) return b;
  return Math.max(b, mean + (sd * Math.exp((-z * z) / 2)) / Math.sqrt(2 * Math.PI) / tail);
}

/** Φ by the Abramowitz–Stegun 26.2.17 approximation (error below 7.5e-8). */
function normalCdf(z: number): number {
  const t = 1 / (1 + 0.2316419 * Math.abs(z));
  const poly = t * (0.31938153 + t * (-0.356563782 + t * (1.781477937 + t * (-1.821255978 + t * 1.330274429))));
  const upper = (Math.exp((-z * z) / 2) / Math.sqrt(2 * Math.PI)) * poly;
  return z >= 0 ? 1 - upper : upper;
}
