import { Throughput, type Job, type Rank } from './rank.js';

// SGLang's scheduler constants (managers/scheduler.py and environ.py): admission reserves
// new_token_ratio of each request's remaining max_new_tokens, the ratio starts at 0.7
// (SGLANG_INIT_NEW_TOKEN_RATIO), decays to 0.7 × 0.14 (SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR) over
// 600 decode steps (SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS) and jumps back after a retraction; the
// estimate clips max_new_tokens at 4096 (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION).
const INIT_NEW_TOKEN_RATIO = 0.7;
const MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14;
const NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600;
const CLIP_MAX_NEW_TOKENS = 4096;

/** How often a busy rank catches up with the clock: an answer leaves at most this late. */
const TICK_MS = 10;

/**
 * How a KV rank admits requests. `optimistic` is SGLang's reservation rule: a request joins
 * the batch while new_token_ratio of its max_new_tokens still fits. `none` checks nothing but
 * the running limit: see KvRank for what over-committing the pool then costs.
 */
export type KvAdmission = 'optimistic' | 'none';

export interface KvSettings {
  readonly kvTokens: number;
  /** `optimistic` when absent. */
  readonly kvAdmission?: KvAdmission;
  readonly tokensPerSecond: number;
  readonly prefillTokensPerSecond: number;
  readonly retractStallMs: number;
}

interface Seq {
  readonly job: Job;
  generated: number;
  /**
   * Counted as retracted since it last made progress: a victim re-admitted and retracted again at
   * every decode step without a token in between is one retracted request, as SGLang counts it, not
   * one a step.
   */
  counted?: boolean;
}

export interface KvClock {
  now(): number;
  /** Calls `fn` after `ms`; returns a cancel function. */
  after(ms: number, fn: () => void): () => void;
}

const realClock: KvClock = {
  now: () => performance.now(),
  after: (ms, fn) => {
    const timer = setTimeout(fn, ms);
    return () => clearTimeout(timer);
  },
};

/**
 * A rank with a KV pool, stepped like SGLang's scheduler loop. Each step is either a prefill
 * of the requests admitted now, which stalls the whole rank for (prompt + generated − the
 * prompt's cached prefix) / prefillTokensPerSecond, or a decode step of 1 / tokensPerSecond that gives every running
 * request one token. Admission is optimistic (only new_token_ratio of max_new_tokens is
 * reserved), so the batch can outgrow the pool; then the request with the fewest generated
 * tokens (longest prompt first on ties) is retracted to the head of the queue, keeping its
 * tokens but not its KV, and must be prefilled again. Steps run in the rank's own virtual
 * time, which follows the clock; an answer is released once the clock reaches its step's end.
 *
 * With kvAdmission `none` the rank behaves like a default-launched SGLang whose advertised
 * running limit (effective_max_running_requests_per_dp, 2048 or more) is far past what its pool
 * holds, with nothing but that limit to stop admission: every queued request up to the limit is
 * prefilled, and each decode step first retracts (fewest generated tokens first, then longest
 * prompt, then latest admitted, as SGLang's retract_decode sorts) until the batch fits. A
 * retracted request loses its progress, so it is prefilled again from its prompt and regenerates
 * its answer, and while the batch asked for more KV than the pool has, the decode step takes
 * 1 / tokensPerSecond × (asked / pool): the eviction and recomputation churn that sglang #26248
 * saw as decode about 14 times slower after retraction. The cost grows with the over-commitment,
 * so throughput peaks where the client's concurrency about fills the pool and falls past it, as
 * the CONCUR paper found (up to 4 times more throughput with KV-aware admission).
 */
export class KvRank implements Rank {
  readonly #running = new Map<Job, Seq>();
  // Retracted requests go back first, ahead of those that never ran (SGLang sorts them by arrival).
  readonly #retracted = new Map<Job, Seq>();
  readonly #waiting = new Map<Job, Seq>();
  readonly #finished: { at: number; job: Job }[] = [];
  readonly #throughput = new Throughput();
  #usedTokens = 0;
  #maxUsedTokens = 0;
  #ratio = INIT_NEW_TOKEN_RATIO;
  #retractions = 0;
  #now: number;
  #cancelTick: (() => void) | undefined;

  constructor(
    private readonly settings: KvSettings,
    private readonly limit: () => number,
    private readonly onStart: () => void,
    private readonly clock: KvClock = realClock,
  ) {
    this.#now = clock.now();
  }

  get running(): number {
    return this.#running.size;
  }

  get queued(): number {
    return this.#retracted.size + this.#waiting.size;
  }

  get usedTokens(): number {
    // Without KV admission the batch holds more than the pool between a prefill and the retractions after it.
    return this.#noAdmission() ? Math.min(this.#usedTokens, this.settings.kvTokens) : this.#usedTokens;
  }

  get maxUsedTokens(): number {
    return this.#maxUsedTokens;
  }

  get retractedWaiting(): number {
    return this.#retracted.size;
  }

  // The KV model orders its queue by arrival only: priority scheduling is modelled on count-based ranks.
  readonly preemptions = 0;

  get retractions(): number {
    return this.#retractions;
  }

  hasRoomFor(job: Job): boolean {
    if (this.queued > 0 || this.#running.size >= this.limit()) return false;
    return this.#noAdmission() || this.#need(job, 0) <= this.#budget();
  }

  enter(job: Job): void {
    this.#advance();
    this.#waiting.set(job, { job, generated: 0 });
    this.#advance();
  }

  leave(job: Job): void {
    const seq = this.#running.get(job);
    if (seq) {
      this.#running.delete(job);
      this.#usedTokens -= job.promptTokens + seq.generated;
    } else if (!this.#retracted.delete(job)) {
      this.#waiting.delete(job);
    }
  }

  refill(): void {
    this.#advance();
  }

  genThroughput(): number {
    return this.#throughput.rate();
  }

  close(): void {
    this.#cancelTick?.();
    this.#cancelTick = undefined;
  }

  #noAdmission(): boolean {
    return this.settings.kvAdmission === 'none';
  }

  #idle(): boolean {
    return this.#running.size === 0 && this.queued === 0;
  }

  /** Runs every step that starts by now, then releases the answers whose step has ended. */
  #advance(): void {
    const now = this.clock.now();
    if (this.#idle()) this.#now = Math.max(this.#now, now);
    while (this.#now <= now && !this.#idle()) this.#now += this.#step();
    while (this.#finished.length > 0 && this.#finished[0].at <= now) this.#finished.shift()!.job.finish();
    if (!this.#cancelTick && (!this.#idle() || this.#finished.length > 0)) {
      this.#cancelTick = this.clock.after(TICK_MS, () => {
        this.#cancelTick = undefined;
        this.#advance();
      });
    }
  }

  /** One scheduler step; returns its length in ms. */
  #step(): number {
    const prefillTokens = this.#admit();
    if (prefillTokens > 0) {
      const { prefillTokensPerSecond } = this.settings;
      return prefillTokensPerSecond > 0 ? (prefillTokens / prefillTokensPerSecond) * 1000 : 0;
    }
    const { tokensPerSecond, retractStallMs, kvTokens } = this.settings;
    let decode = tokensPerSecond > 0 ? 1000 / tokensPerSecond : 0;
    let retracted: number;
    if (this.#noAdmission()) {
      // What the batch asks for this step: what it holds plus one token each.
      const asked = this.#usedTokens + this.#running.size;
      if (asked > kvTokens) decode *= asked / kvTokens;
      retracted = this.#retractOvercommitted();
    } else {
      retracted = this.#retractWhileFull();
    }
    const length = decode + retracted * retractStallMs;
    // At zero latency a decode step finishes every running request.
    const gain = tokensPerSecond > 0 ? 1 : Infinity;
    let generated = 0;
    this.#maxUsedTokens = Math.max(this.#maxUsedTokens, this.#usedTokens + this.#running.size);
    for (const seq of this.#running.values()) {
      const add = Math.min(gain, seq.job.completionTokens - seq.generated);
      seq.generated += add;
      if (add > 0) seq.counted = false;
      generated += add;
      this.#usedTokens += add;
      if (seq.generated >= seq.job.completionTokens) {
        this.#running.delete(seq.job);
        this.#usedTokens -= seq.job.promptTokens + seq.generated;
        this.#finished.push({ at: this.#now + length, job: seq.job });
      }
    }
    this.#throughput.add(generated);
    this.#ratio = Math.max(MIN_NEW_TOKEN_RATIO, this.#ratio - NEW_TOKEN_RATIO_DECAY);
    return length;
  }

  // KV a request is expected to need: what it holds plus its share of the tokens still to come.
  #need(job: Job, generated: number): number {
    return job.promptTokens + generated + Math.min(job.maxNewTokens - generated, CLIP_MAX_NEW_TOKENS) * this.#ratio;
  }

  #budget(): number {
    let reserved = this.#usedTokens;
    for (const seq of this.#running.values()) reserved += this.#need(seq.job, seq.generated) - seq.job.promptTokens - seq.generated;
    return this.settings.kvTokens - reserved;
  }

  /** Admits queued requests in order while their expected KV fits; returns the tokens to prefill. */
  #admit(): number {
    if (this.queued === 0) return 0;
    let budget = this.#budget();
    let tokens = 0;
    for (const queue of [this.#retracted, this.#waiting]) {
      for (const seq of queue.values()) {
        if (this.#running.size >= this.limit()) return tokens;
        const need = this.#need(seq.job, seq.generated);
        // An empty rank takes the head of the queue whatever its size, or it would never run.
        if (need > budget && this.#running.size > 0 && !this.#noAdmission()) return tokens;
        budget -= need;
        queue.delete(seq.job);
        this.#running.set(seq.job, seq);
        const held = seq.job.promptTokens + seq.generated;
        this.#usedTokens += held;
        // The cached prefix stays locked while the request lives, so a retracted one finds it again.
        tokens += held - (seq.job.cachedTokens ?? 0);
        this.#maxUsedTokens = Math.max(this.#maxUsedTokens, this.#usedTokens);
        this.onStart();
        seq.job.start();
      }
    }
    return tokens;
  }

  // Every running request needs one more token of KV for the next decode step; returns how many were retracted.
  #retractWhileFull(): number {
    let retracted = 0;
    while (this.#usedTokens + this.#running.size > this.settings.kvTokens && this.#running.size > 1) {
      let victim: Seq | undefined;
      for (const seq of this.#running.values()) {
        if (!victim || seq.generated < victim.generated || (seq.generated === victim.generated && seq.job.promptTokens > victim.job.promptTokens)) {
          victim = seq;
        }
      }
      this.#running.delete(victim!.job);
      this.#usedTokens -= victim!.job.promptTokens + victim!.generated;
      this.#retracted.set(victim!.job, victim!);
      this.#count(victim!);
      retracted++;
      this.#ratio = INIT_NEW_TOKEN_RATIO;
    }
    return retracted;
  }

  /**
   * kvAdmission `none`: retracts until the batch fits, in SGLang's order, and throws away each
   * victim's progress. One sort per step: the batch can hold thousands of requests.
   */
  #retractOvercommitted(): number {
    const { kvTokens } = this.settings;
    if (this.#usedTokens + this.#running.size <= kvTokens || this.#running.size <= 1) return 0;
    // Stable: among equals the latest admitted ends up last, and goes first.
    const order = [...this.#running.values()].sort((a, b) => b.generated - a.generated || a.job.promptTokens - b.job.promptTokens);
    const victims: Seq[] = [];
    while (this.#usedTokens + this.#running.size > kvTokens && this.#running.size > 1) {
      const victim = order.pop()!;
      this.#running.delete(victim.job);
      this.#usedTokens -= victim.job.promptTokens + victim.generated;
      victim.generated = 0;
      victims.push(victim);
    }
    // Back to the queue in the order they were admitted, so that the oldest is prefilled first again.
    for (let i = victims.length - 1; i >= 0; i--) this.#retracted.set(victims[i].job, victims[i]);
    for (const victim of victims) this.#count(victim);
    return victims.length;
  }

  #count(victim: Seq): void {
    if (victim.counted) return;
    victim.counted = true;
    this.#retractions++;
  }
}
