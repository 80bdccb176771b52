export interface Job {
  start(): void;
}

export interface Limits {
  readonly maxRunning: number;
  readonly maxQueue: number;
}

/**
 * SGLang's admission: at most `maxRunning` requests run at once, later ones wait in a
 * bounded FIFO queue. Limits are read on every decision, so a runtime change applies at once.
 */
export class Slots {
  readonly #running = new Set<Job>();
  // A Set keeps arrival order and lets a job whose client gave up leave in O(1).
  readonly #queue = new Set<Job>();
  #maxRunningSeen = 0;
  #refilling = false;

  constructor(private readonly limits: Limits) {}

  get running(): number {
    return this.#running.size;
  }

  get queued(): number {
    return this.#queue.size;
  }

  get maxRunningSeen(): number {
    return this.#maxRunningSeen;
  }

  /** Runs or queues the job; false when every slot is taken and the queue is full. */
  enter(job: Job): boolean {
    if (this.#running.size >= this.limits.maxRunning && this.#queue.size >= this.limits.maxQueue) return false;
    this.#queue.add(job);
    this.refill();
    return true;
  }

  /** The job finished or was abandoned: free its slot or its place in the queue. */
  leave(job: Job): void {
    if (!this.#running.delete(job)) this.#queue.delete(job);
    this.refill();
  }

  /** Starts queued jobs while slots are free. */
  refill(): void {
    // A job that finishes synchronously calls leave() from inside start(); the loop below
    // already picks up the slot it frees, so nesting would only deepen the stack.
    if (this.#refilling) return;
    this.#refilling = true;
    try {
      for (const job of this.#queue) {
        if (this.#running.size >= this.limits.maxRunning) break;
        this.#queue.delete(job);
        this.#running.add(job);
        this.#maxRunningSeen = Math.max(this.#maxRunningSeen, this.#running.size);
        job.start();
      }
    } finally {
      this.#refilling = false;
    }
  }
}
