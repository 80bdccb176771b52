import { Ring } from '../domain/ring.js';

/**
 * Counts over a sliding window of one-second buckets, so a rate reflects the last minute and not
 * the whole run: a slow start or a pause does not distort it.
 */
export class RateWindow {
  private readonly buckets: Float64Array;
  private readonly tokens: Float64Array;
  /** A conversation run's answered turns (its requests), counted beside its finished conversations. */
  private readonly turns: Float64Array;
  private readonly stamps: Float64Array;
  private firstAt: number | null = null;

  constructor(private readonly seconds = 60) {
    this.buckets = new Float64Array(seconds);
    this.tokens = new Float64Array(seconds);
    this.turns = new Float64Array(seconds);
    this.stamps = new Float64Array(seconds).fill(-1);
  }

  add(now: number, samples: number, tokens: number, turns = 0): void {
    const sec = Math.floor(now / 1000);
    const i = sec % this.seconds;
    if (this.stamps[i] !== sec) {
      this.stamps[i] = sec;
      this.buckets[i] = 0;
      this.tokens[i] = 0;
      this.turns[i] = 0;
    }
    this.buckets[i] += samples;
    this.tokens[i] += tokens;
    this.turns[i] += turns;
    this.firstAt ??= now;
  }

  /** Per-second rates over the window, or over the time since the first event when that is shorter. */
  rates(now: number): { samples: number; tokens: number; turns: number } {
    if (this.firstAt === null) return { samples: 0, tokens: 0, turns: 0 };
    const sec = Math.floor(now / 1000);
    let s = 0;
    let t = 0;
    let u = 0;
    for (let i = 0; i < this.seconds; i++) {
      if (this.stamps[i] > sec - this.seconds) {
        s += this.buckets[i];
        t += this.tokens[i];
        u += this.turns[i];
      }
    }
    const span = Math.min(this.seconds, Math.max(1, (now - this.firstAt) / 1000));
    return { samples: s / span, tokens: t / span, turns: u / span };
  }
}

/** The last N latencies, for a median without keeping every request. */
export class LatencyRing {
  private readonly ring: Ring;
  constructor(size = 256) {
    this.ring = new Ring(size);
  }

  add(ms: number): void {
    this.ring.push(ms);
  }

  p50(): number | null {
    if (!this.ring.size) return null;
    // A typed array's sort is numeric.
    const sorted = this.ring.held().slice().sort();
    return sorted[Math.floor(sorted.length / 2)];
  }
}
