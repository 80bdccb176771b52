import { preempts, standing, type PriorityPolicy } from './priority.js';
import { Throughput, type Job, type Rank } from './rank.js';

/**
 * A rank without a KV budget: at most `limit()` requests run at once, later ones wait in
 * FIFO order. The limit is read on every decision, so a runtime change applies at once.
 * The server times each running job and calls leave() when it answers.
 *
 * With a priority policy (`--enable-priority-scheduling`) the queue goes by priority, then
 * arrival, and a full rank lets the best waiting request push out the running one of lowest
 * priority (the latest admitted among equals) when it outranks it by more than the threshold,
 * as SGLang's PrefillAdder.preempt_to_schedule does on a full batch. The preempted job waits in
 * the queue again as a new arrival and goes on from where it stopped when it runs.
 */
export class Slots implements Rank {
  readonly #running = new Set<Job>();
  // A Set keeps arrival order and lets a job whose client gave up leave in O(1).
  readonly #queue = new Set<Job>();
  readonly #throughput = new Throughput();
  #usedTokens = 0;
  #maxUsedTokens = 0;
  #refilling = false;
  #preemptions = 0;

  constructor(
    private readonly limit: () => number,
    private readonly onStart: () => void,
    private readonly policy: () => PriorityPolicy | null = () => null,
  ) {}

  /** Running jobs pushed back to the queue by one of higher priority. */
  get preemptions(): number {
    return this.#preemptions;
  }

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
      const policy = this.policy();
      for (let job = this.#next(policy); job; job = this.#next(policy)) {
        if (this.#running.size >= this.limit() && !(policy && this.#preemptFor(job, policy))) break;
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

  /** The queued job to run next: the first to arrive, or under a policy the best standing, the first to arrive among equals. */
  #next(policy: PriorityPolicy | null): Job | undefined {
    let best: Job | undefined;
    let bestStanding = Number.NEGATIVE_INFINITY;
    for (const job of this.#queue) {
      if (!policy) return job;
      const s = standing(job.priority, policy);
      if (best === undefined || s > bestStanding) {
        best = job;
        bestStanding = s;
      }
    }
    return best;
  }

  /** Pushes the running job of lowest standing back to the queue if `job` outranks it enough; true when it did. */
  #preemptFor(job: Job, policy: PriorityPolicy): boolean {
    let victim: Job | undefined;
    let lowest = Number.POSITIVE_INFINITY;
    // Running jobs iterate in admission order: `<=` settles ties on the latest admitted.
    for (const running of this.#running) {
      const s = standing(running.priority, policy);
      if (victim === undefined || s <= lowest) {
        victim = running;
        lowest = s;
      }
    }
    if (!victim || !preempts(standing(job.priority, policy), lowest, policy)) return false;
    this.#running.delete(victim);
    this.#usedTokens -= victim.promptTokens + victim.completionTokens;
    this.#queue.add(victim);
    this.#preemptions++;
    victim.preempt?.();
    return true;
  }

  genThroughput(): number {
    return this.#throughput.rate();
  }

  close(): void {}
}
