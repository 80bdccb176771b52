/** A chat request as a DP rank's scheduler sees it. */
export interface Job {
  readonly promptTokens: number;
  /** Prompt tokens the prefix cache holds: prefill computes only the rest. */
  readonly cachedTokens?: number;
  /** Tokens the reply will have once generation ends. */
  readonly completionTokens: number;
  /** The request's max_new_tokens: what KV admission reserves a share of. */
  readonly maxNewTokens: number;
  /** SGLang's `priority` as sent, or null; read only by a rank scheduling by priority. */
  readonly priority?: number | null;
  /** The job left the queue and runs; after a preemption, it runs again from where it stopped. */
  start(): void;
  /** Pushed out of the batch by a request of higher priority: it stops and waits in the queue again. */
  preempt?(): void;
  /** The last token is generated (KV ranks only: a count-based rank leaves timing to the server). */
  finish(): void;
}

/** One data-parallel rank's scheduler: its running batch, its waiting queue and the KV they hold. */
export interface Rank {
  readonly running: number;
  readonly queued: number;
  /** KV tokens the running requests hold. */
  readonly usedTokens: number;
  /** The most KV tokens the running requests ever held at once. */
  readonly maxUsedTokens: number;
  /** Requests pushed back to the queue for lack of KV, waiting to be prefilled again. */
  readonly retractedWaiting: number;
  readonly retractions: number;
  /** Running requests pushed back to the queue by one of higher priority (count-based ranks only). */
  readonly preemptions: number;
  /** Would `job` run at once, with nothing queued ahead of it? */
  hasRoomFor(job: Job): boolean;
  enter(job: Job): void;
  /** The job finished or its client gave up: it frees its place, running or queued. */
  leave(job: Job): void;
  /** Starts queued jobs while there is room (after a limit was raised at runtime). */
  refill(): void;
  /** Generated tokens per second over the last full window. */
  genThroughput(): number;
  close(): void;
}

// SGLang logs gen_throughput over its decode log interval; one second is short enough to follow a sweep.
const THROUGHPUT_WINDOW_MS = 1000;

/** Generated tokens per second, measured over the last complete one-second window. */
export class Throughput {
  #windowStart = performance.now();
  #windowTokens = 0;
  #rate = 0;

  add(tokens: number): void {
    this.#roll();
    this.#windowTokens += tokens;
  }

  rate(): number {
    this.#roll();
    return this.#rate;
  }

  #roll(): void {
    const now = performance.now();
    const elapsed = now - this.#windowStart;
    if (elapsed < THROUGHPUT_WINDOW_MS) return;
    // A window that ended long ago with no traffic since means the rank is idle now.
    this.#rate = elapsed < 2 * THROUGHPUT_WINDOW_MS ? (this.#windowTokens * 1000) / elapsed : 0;
    this.#windowStart = now;
    this.#windowTokens = 0;
  }
}
