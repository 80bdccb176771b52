import { Throughput, type Job, type Rank } from './rank.js';

/**
 * A rank without a KV budget: at most `limit()` requests run at once, later ones wait in
 * FIFO order. The limit is read on every decision, so a runtime change applies at once.
 * The server times each running job and calls leave() when it answers.
 */
export class Slots implements Rank {
  readonly #running = new Set<Job>();
  // A Set keeps arrival order and lets a job whose client gave up leave in O(1).
  readonly #queue = new Set<Job>();
  readonly #throughput = new Throughput();
  #usedTokens = 0;
  #maxUsedTokens = 0;
  #refilling = false;

  constructor(
    private readonly limit: () => number,
    private readonly onStart: () => void,
  ) {}

  get running(): number {
    return this.#running.size;
  }

  get queued(): number {
    return this.#queue.size;
  }

  get usedTokens(): number {
    return this.#usedTokens;
  }

  get maxUsedTokens(): number {
    return this.#maxUsedTokens;
  }

  readonly retractedWaiting = 0;
  readonly retractions = 0;

  hasRoomFor(): boolean {
    return this.#queue.size === 0 && this.#running.size < this.limit();
  }

  enter(job: Job): void {
    this.#queue.add(job);
    this.refill();
  }

  leave(job: Job): void {
    if (this.#running.delete(job)) {
      this.#usedTokens -= job.promptTokens + job.completionTokens;
      this.#throughput.add(job.completionTokens);
    } else {
      this.#queue.delete(job);
    }
    this.refill();
  }

  refill(): void {
    // A job that finishes synchronously calls leave() from inside start(); the loop below
    // already picks up the slot it frees, so nesting would only deepen the stack.
    if (this.#refilling) return;
    this.#refilling = true;
    try {
      for (const job of this.#queue) {
        if (this.#running.size >= this.limit()) break;
        this.#queue.delete(job);
        this.#running.add(job);
        // Without a KV model a request holds its whole length from the start.
        this.#usedTokens += job.promptTokens + job.completionTokens;
        this.#maxUsedTokens = Math.max(this.#maxUsedTokens, this.#usedTokens);
        this.onStart();
        job.start();
      }
    } finally {
      this.#refilling = false;
    }
  }

  genThroughput(): number {
    return this.#throughput.rate();
  }

  close(): void {}
}
