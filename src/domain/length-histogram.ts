// short_for_run: an answer far shorter than its own run's answers. too_short needs a minimum the
// run asks for; this one needs none, since a run of reasoning answers 500-8000 tokens long that
// starts answering "OK." in 3 tokens is broken whatever the run asked.

/** Buckets per doubling of length: neighbouring bounds differ by 2^(1/4), so the median is known within ±9%. */
export const LENGTH_BUCKETS_PER_OCTAVE = 4;
/** Lengths up to 2^20 tokens (above any context SGLang serves) have their own bucket; longer share the last. */
export const LENGTH_OCTAVES = 20;
/** Bucket 0 holds 0 tokens; bucket i ≥ 1 holds [2^((i-1)/4), 2^(i/4)). */
export const LENGTH_BUCKETS = 1 + LENGTH_OCTAVES * LENGTH_BUCKETS_PER_OCTAVE;
/** Answers counted before the run's median is trusted (the gate's default min_samples). */
export const SHORT_MIN_SAMPLES = 200;
/**
 * Shorter than the median by this factor. Completion lengths of one run spread log-normally, most
 * within a factor of 3 of their median; 8 is 3 doublings below it, where a healthy answer is rare.
 */
export const SHORT_FACTOR = 8;
/** And shorter than this, whatever the median: one sentence. A 100-token answer is never "far too short". */
export const SHORT_FLOOR_TOKENS = 32;
/**
 * Runs with a shorter median are runs of short answers, where one token is a normal answer ("42",
 * "Paris"): none is short for them. From this median on, short means under 16 tokens at least.
 */
export const SHORT_MIN_MEDIAN = SHORT_FACTOR * 16;

/** The bucket a length falls in. */
export function lengthBucket(tokens: number): number {
  if (tokens < 1) return 0;
  return Math.min(LENGTH_BUCKETS - 1, 1 + Math.floor(Math.log2(tokens) * LENGTH_BUCKETS_PER_OCTAVE));
}

/** The smallest length bucket i holds; the runner can count a bucket as a range of completion_tokens. */
export function bucketLowerBound(i: number): number {
  return i === 0 ? 0 : 2 ** ((i - 1) / LENGTH_BUCKETS_PER_OCTAVE);
}

/**
 * A run's completion lengths in a fixed log-spaced histogram: O(1) memory whatever the run's size,
 * and restorable after a restart from the database's completion_tokens (`add(tokens, count)`).
 */
export class LengthHistogram {
  private readonly counts = new Float64Array(LENGTH_BUCKETS);
  private n = 0;
  private cachedMedian: number | null = null;

  get total(): number {
    return this.n;
  }

  add(tokens: number, count = 1): void {
    this.counts[lengthBucket(tokens)] += count;
    this.n += count;
    this.cachedMedian = null;
  }

  /**
   * The median length, as the geometric middle of its bucket; null when empty. O(LENGTH_BUCKETS),
   * kept until the next add.
   */
  median(): number | null {
    if (this.n === 0) return null;
    if (this.cachedMedian !== null) return this.cachedMedian;
    const half = Math.ceil(this.n / 2);
    let seen = 0;
    let i = 0;
    while ((seen += this.counts[i]) < half) i++;
    this.cachedMedian = i === 0 ? 0 : bucketLowerBound(i) * 2 ** (0.5 / LENGTH_BUCKETS_PER_OCTAVE);
    return this.cachedMedian;
  }

  /**
   * Far below the run's median once enough answers are in: under median / 8 and under 32 tokens,
   * in a run whose median is at least 128 tokens.
   */
  isShort(tokens: number): boolean {
    if (tokens >= SHORT_FLOOR_TOKENS || this.n < SHORT_MIN_SAMPLES) return false;
    const median = this.median()!;
    return median >= SHORT_MIN_MEDIAN && tokens < median / SHORT_FACTOR;
  }
}
