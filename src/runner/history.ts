import type { RunnerDeps } from '../deps.js';
import { addHistory, compactHistory, runCounters, type RunCounters, type SeriesPoint } from '../db/history.js';
import { HISTORY_STEP_MS, HISTORY_TIERS, type EndpointLoad } from '../domain/history.js';
import type { RunnerSnapshot } from '../domain/live-view.js';

/** How often aged points are merged into coarser ones: the middle tier's step, so each merge is a bucket or two. */
const COMPACT_MS = HISTORY_TIERS[1].stepMs;

type Counts = Omit<RunCounters, 'id'>;

/** What was answered between two readings of a run's counters; a retry takes answers back, which count as none. */
function delta(now: Counts, before: Counts | undefined): Counts {
  const d = (k: keyof Counts) => Math.max(0, now[k] - (before?.[k] ?? 0));
  return { completed: d('completed'), completionTokens: d('completionTokens'), promptTokens: d('promptTokens'), cachedTokens: d('cachedTokens') };
}

/**
 * Records the throughput history (domain/history.ts) on the coordinating runner, every
 * HISTORY_STEP_MS: each run's answers since the last point, from its counters in the store (so on
 * PostgreSQL every replica's answers count), and the fleet's, with each endpoint's requests in
 * flight and cap from the merged live view.
 */
export class HistoryRecorder {
  /** Each run's counters at the last point; null until the first reading, which only sets the baseline. */
  private last: Map<string, Counts> | null = null;
  private lastAt = 0;
  private compactedAt = 0;

  /**
   * @param live the whole fleet's live view (runner.ts `snapshot`)
   * @param caps each dispatchable endpoint's cap, across the replicas
   */
  constructor(
    private readonly deps: RunnerDeps,
    private readonly live: () => RunnerSnapshot,
    private readonly caps: () => Record<string, number>,
  ) {}

  /** Called on every tick: records a point once HISTORY_STEP_MS has passed, and merges aged points now and then. */
  async tick(): Promise<void> {
    const now = this.deps.clock();
    if (now - this.lastAt < HISTORY_STEP_MS) return;
    const readings = await runCounters(this.deps.db, this.lastAt);
    const before = this.last;
    const since = this.lastAt;
    this.last = new Map(readings.map(({ id, ...c }) => [id, c]));
    this.lastAt = now;
    if (before) await addHistory(this.deps.db, this.points(readings, before, since, now));
    if (now - this.compactedAt >= COMPACT_MS) {
      this.compactedAt = now;
      await compactHistory(this.deps.db, now);
    }
  }

  private points(readings: RunCounters[], before: Map<string, Counts>, since: number, now: number): SeriesPoint[] {
    const span = { at: since, stepMs: HISTORY_STEP_MS, spanMs: now - since };
    const fleet: Counts = { completed: 0, completionTokens: 0, promptTokens: 0, cachedTokens: 0 };
    const points: SeriesPoint[] = [];
    for (const { id, ...counts } of readings) {
      // A run first seen now started since the last point: all its answers are new.
      const d = delta(counts, before.get(id));
      for (const k of Object.keys(fleet) as (keyof Counts)[]) fleet[k] += d[k];
      points.push({ runId: id, ...span, ...this.counts(d), inFlight: null, cap: null, endpoints: null });
    }
    const caps = this.caps();
    const endpoints: Record<string, EndpointLoad> = {};
    let inFlight = 0;
    let cap = 0;
    for (const [id, e] of Object.entries(this.live().endpoints)) {
      if (!(id in caps) && e.in_flight === 0) continue;
      endpoints[id] = [e.in_flight, caps[id] ?? 0];
      inFlight += e.in_flight;
      cap += caps[id] ?? 0;
    }
    // An idle fleet with no run to serve adds nothing: its chart has a gap there.
    if (readings.length || inFlight > 0) points.push({ runId: null, ...span, ...this.counts(fleet), inFlight, cap, endpoints });
    return points;
  }

  private counts(c: Counts) {
    return { samples: c.completed, completionTokens: c.completionTokens, promptTokens: c.promptTokens, cachedTokens: c.cachedTokens };
  }
}
