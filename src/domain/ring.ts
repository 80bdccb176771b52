/**
 * The last `capacity` numbers pushed, each new one overwriting the oldest once it is full: the
 * bookkeeping of every fixed window of recent answers (their texts' hashes, their flags, their
 * latencies), in memory fixed by the capacity.
 */
export class Ring {
  private readonly slots: Float64Array;
  private next = 0;
  private filled = 0;

  constructor(readonly capacity: number) {
    this.slots = new Float64Array(capacity);
  }

  /** Numbers held: those pushed, up to the capacity. */
  get size(): number {
    return this.filled;
  }

  /** Adds a number; returns the oldest one it pushed out, or undefined while there was room. */
  push(value: number): number | undefined {
    const out = this.filled === this.capacity ? this.slots[this.next] : undefined;
    if (out === undefined) this.filled++;
    this.slots[this.next] = value;
    this.next = (this.next + 1) % this.capacity;
    return out;
  }

  /** The numbers held, in no particular order (a view: it changes with the next push). */
  held(): Float64Array {
    return this.slots.subarray(0, this.filled);
  }

  clear(): void {
    this.next = this.filled = 0;
  }
}
