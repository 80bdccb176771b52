import { FLAGS, type Flag } from './flags.js';
import type { GateSettings } from './quality.js';
import { Ring } from './ring.js';

// The gate over the last answers, not the whole run: a run that turns bad after 100,000 healthy
// samples is over its limit within a hundred bad ones, where the run's own share would take
// another 30,000.

/**
 * Samples the window holds. At 87% flagged and a 20% limit it trips after 92 bad samples; a
 * healthy run flagged 10% of the time (truncations, say) has a windowed share with σ 1.5
 * points, so the 20% limit is 6.7σ away.
 */
export const QUALITY_WINDOW = 400;

/**
 * The flag bitmasks of the last samples, with the count of each flag and of flagged samples kept
 * as they enter and leave: O(flags set) a sample, memory fixed by the capacity.
 */
export class QualityWindow {
  private readonly ring: Ring;
  private readonly byFlag = new Int32Array(FLAGS.length);
  private flaggedCount = 0;
  private seen = 0;

  constructor(readonly capacity = QUALITY_WINDOW) {
    this.ring = new Ring(capacity);
  }

  /** Samples in the window. */
  get size(): number {
    return this.ring.size;
  }

  /** Samples ever pushed, those before a restart included (see restore). */
  get total(): number {
    return this.seen;
  }

  /** Samples in the window with any flag. */
  get flagged(): number {
    return this.flaggedCount;
  }

  /** Flagged share of the window; 0 when it is empty. */
  get share(): number {
    return this.ring.size === 0 ? 0 : this.flaggedCount / this.ring.size;
  }

  push(flags: number): void {
    const left = this.ring.push(flags);
    if (left !== undefined) this.count(left, -1);
    this.count(flags, 1);
    this.seen++;
  }

  /**
   * Refills the window after a restart from the run's latest completed samples' flags, newest
   * first (db/samples.ts recentCompleted); `total` is the run's completed count.
   */
  restore(newestFirst: readonly number[], total = newestFirst.length): void {
    this.ring.clear();
    this.byFlag.fill(0);
    this.flaggedCount = this.seen = 0;
    const kept = newestFirst.slice(0, this.capacity);
    for (let i = kept.length - 1; i >= 0; i--) this.push(kept[i]);
    this.seen = Math.max(total, kept.length);
  }

  /** Samples in the window carrying this flag. */
  flagCount(flag: Flag): number {
    return this.byFlag[FLAGS.indexOf(flag)];
  }

  /** Each flag's count in the window. */
  counts(): Record<Flag, number> {
    return Object.fromEntries(FLAGS.map((f, i) => [f, this.byFlag[i]])) as Record<Flag, number>;
  }

  /** The flag most samples of the window carry, or null when none is flagged. */
  dominantFlag(): Flag | null {
    let best = -1;
    for (let i = 0; i < FLAGS.length; i++) if (this.byFlag[i] > 0 && (best < 0 || this.byFlag[i] > this.byFlag[best])) best = i;
    return best < 0 ? null : FLAGS[best];
  }

  /** Enough samples are done to judge, and the window's flagged share is over the limit. */
  overLimit(gate: GateSettings): boolean {
    return windowsOverLimit(this.seen, [this], gate);
  }

  private count(flags: number, delta: number): void {
    if (flags === 0) return;
    this.flaggedCount += delta;
    for (let i = 0; i < FLAGS.length; i++) if (flags & (1 << i)) this.byFlag[i] += delta;
  }
}

// ---- endpoints against their peers ----

/** Samples an endpoint's window needs before it is judged against its peers, and the peers together too. */
export const ENDPOINT_MIN_SAMPLES = 50;
/**
 * A two-proportion z above this says the endpoint is worse than its peers by more than chance:
 * z ≥ 4 happens by chance about once in 30,000 one-sided, and verdicts are asked many times a run.
 */
export const ENDPOINT_MIN_Z = 4;

/** An endpoint clearly worse than the others: to take out of dispatch. */
export interface EndpointQuarantine {
  endpointId: string;
  /** Flagged share of its window. */
  share: number;
  /** Samples in its window. */
  samples: number;
  /** Flagged share of the other endpoints' windows pooled. */
  peerShare: number;
  /** The flag most of its samples carry, and that flag's share of its window. */
  flag: Flag;
  flagShare: number;
}

/**
 * The endpoints to take out of dispatch, worst first. One is, once its window has
 * ENDPOINT_MIN_SAMPLES, when either
 * - it is over the limit while its peers pooled are under half of it (one bad server among good
 *   ones), or
 * - it exceeds its peers by at least half the limit, with z ≥ ENDPOINT_MIN_Z (worse than its
 *   peers, say 2 broken servers of 5, even when the run as a whole is over the limit).
 * Peers need ENDPOINT_MIN_SAMPLES between them, and one endpoint is always left: a fault of every
 * endpoint is the run's gate's to report.
 */
export function endpointVerdict(
  windows: ReadonlyMap<string, QualityWindow>,
  gate: GateSettings,
  /** Peers judged elsewhere (PostgreSQL: endpoints other replicas drive), as their drivers count them: they weigh as peers only. */
  peers: readonly EndpointCounts[] = [],
): EndpointQuarantine[] {
  let allFlagged = 0;
  let allSamples = 0;
  for (const w of [...windows.values(), ...peers]) {
    allFlagged += w.flagged;
    allSamples += w.size;
  }
  const found: EndpointQuarantine[] = [];
  for (const [endpointId, w] of windows) {
    const peerSamples = allSamples - w.size;
    if (w.size < ENDPOINT_MIN_SAMPLES || peerSamples < ENDPOINT_MIN_SAMPLES) continue;
    const peerShare = (allFlagged - w.flagged) / peerSamples;
    const alone = w.share > gate.max_flag_rate && peerShare < gate.max_flag_rate / 2;
    const worse = w.share - peerShare >= gate.max_flag_rate / 2 && zScore(w.flagged, w.size, allFlagged - w.flagged, peerSamples) >= ENDPOINT_MIN_Z;
    if (!alone && !worse) continue;
    const flag = w.dominantFlag()!;
    found.push({ endpointId, share: w.share, samples: w.size, peerShare, flag, flagShare: w.flagCount(flag) / w.size });
  }
  // One endpoint always stays in rotation: another replica's peer, or the best of these.
  return found.sort((a, b) => b.share - a.share).slice(0, Math.max(0, windows.size - (peers.length ? 0 : 1)));
}

/**
 * `seen` samples done are enough to judge, and the windows' flagged share, taken together, is over
 * the limit: one window, or (PostgreSQL) each replica's window of its own answers of a run.
 */
export function windowsOverLimit(seen: number, windows: readonly EndpointCounts[], gate: GateSettings): boolean {
  let size = 0;
  let flagged = 0;
  for (const w of windows) {
    size += w.size;
    flagged += w.flagged;
  }
  return seen >= gate.min_samples && size > 0 && flagged / size > gate.max_flag_rate;
}

/** An endpoint's window in numbers: its answers and how many of them were flagged. */
export interface EndpointCounts {
  size: number;
  flagged: number;
}

/** Two-proportion z statistic of x1/n1 over x2/n2, pooled variance; 0 when the shares are equal. */
export function zScore(x1: number, n1: number, x2: number, n2: number): number {
  const p = (x1 + x2) / (n1 + n2);
  const se = Math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2));
  return se === 0 ? 0 : (x1 / n1 - x2 / n2) / se;
}
