import { AdaptiveCap, serverCeiling } from '../../src/runner/capacity.js';
import { KvRank, type KvClock } from '../../src/sim/kv.js';

/**
 * regen's dispatch against the simulator's KV rank (src/sim/kv.ts) in virtual time: the rank as
 * `npm run bench adaptive` launches it (a running limit of 2048, a pool that holds far fewer, no KV
 * admission), a client that keeps `cap` requests in flight with a few milliseconds of network each
 * way, and load readings every 250 to 500 ms fed to the adaptive cap with the median answer's latency.
 * Deterministic for a seed, and seconds of CPU for minutes of the server's time.
 */
export interface KvDispatchSettings {
  /** A fixed cap, or the adaptive cap when absent. */
  fixedCap?: number;
  seed: number;
  /** How long the run lasts, and the part of it before completions are counted. */
  runMs: number;
  warmMs: number;
}

export interface KvDispatchResult {
  /** Answers per second after the warm-up. */
  rate: number;
  /** Requests the rank retracted over the whole run, its first seconds included. */
  retracted: number;
  /** The cap at the end. */
  cap: number;
}

const RUNNING_LIMIT = 2048;
const KV_TOKENS = 20_000;
const PROMPT_TOKENS = 33;
const COMPLETION_TOKENS = 300;
const TOKENS_PER_SECOND = 200;
const READ_INTERVAL_MS = 250;
/** One way between regen and the server: a loopback request and regen's turnover of an answer into the next request. */
const NETWORK_MS = { least: 2, spread: 30 };
/** Answers the median latency is taken over (the endpoint's LatencyRing holds 256). */
const LATENCIES = 256;

interface Timer {
  at: number;
  /** Timers due at the same moment run in the order they were set. */
  order: number;
  fn: () => void;
  cancelled: boolean;
}

export function runKvDispatch(settings: KvDispatchSettings): KvDispatchResult {
  let now = 0;
  let order = 0;
  const timers: Timer[] = [];
  const clock: KvClock = {
    now: () => now,
    after(ms, fn) {
      const timer: Timer = { at: now + ms, order: order++, fn, cancelled: false };
      timers.push(timer);
      return () => {
        timer.cancelled = true;
      };
    },
  };
  let state = settings.seed;
  // A linear congruential generator: the same run for the same seed.
  const random = () => {
    state = (state * 1_103_515_245 + 12_345) % 2_147_483_648;
    return state / 2_147_483_648;
  };
  const network = () => NETWORK_MS.least + random() * NETWORK_MS.spread;
  const rank = new KvRank(
    { kvTokens: KV_TOKENS, kvAdmission: 'none', tokensPerSecond: TOKENS_PER_SECOND, prefillTokensPerSecond: 0, retractStallMs: 0 },
    () => RUNNING_LIMIT,
    () => {},
    clock,
  );
  const adaptive = settings.fixedCap === undefined ? new AdaptiveCap(serverCeiling(RUNNING_LIMIT), { maxRunning: RUNNING_LIMIT, kvTokens: KV_TOKENS }) : null;
  const cap = () => adaptive?.cap ?? settings.fixedCap!;
  const latencies: number[] = [];
  let inFlight = 0;
  let completed = 0;
  let completedAtWarm = 0;
  const dispatch = () => {
    while (inFlight < cap()) {
      inFlight++;
      const sentAt = now;
      clock.after(network(), () =>
        rank.enter({
          promptTokens: PROMPT_TOKENS,
          completionTokens: COMPLETION_TOKENS,
          maxNewTokens: 1024,
          start() {},
          finish() {
            clock.after(network(), () => {
              inFlight--;
              completed++;
              latencies.push(now - sentAt);
              if (latencies.length > LATENCIES) latencies.shift();
              dispatch();
            });
          },
        }),
      );
    }
  };
  const read = () => {
    if (adaptive) {
      const sorted = [...latencies].sort((a, b) => a - b);
      const load = { at: now, running: rank.running, waiting: rank.queued, tokenUsage: rank.usedTokens / KV_TOKENS, retracted: rank.retractions };
      adaptive.observe(load, inFlight, sorted.length ? sorted[sorted.length >> 1] : null);
      dispatch();
    }
    // A loaded machine's readings come late: anywhere up to twice the interval apart.
    clock.after(READ_INTERVAL_MS * (1 + random()), read);
  };
  dispatch();
  clock.after(READ_INTERVAL_MS, read);
  clock.after(settings.warmMs, () => {
    completedAtWarm = completed;
  });
  while (now < settings.runMs && timers.length > 0) {
    let next = 0;
    for (let i = 1; i < timers.length; i++) {
      if (timers[i].at < timers[next].at || (timers[i].at === timers[next].at && timers[i].order < timers[next].order)) next = i;
    }
    const [timer] = timers.splice(next, 1);
    if (timer.cancelled) continue;
    now = timer.at;
    timer.fn();
  }
  rank.close();
  return { rate: ((completed - completedAtWarm) * 1000) / (settings.runMs - settings.warmMs), retracted: rank.retractions, cap: cap() };
}
