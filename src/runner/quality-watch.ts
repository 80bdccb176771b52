import type { RunnerDeps } from '../deps.js';
import { appendEvent } from '../db/events.js';
import { enqueueEvent, runsWithOwnWebhook } from '../db/webhooks.js';
import { requeueRunSamples } from '../db/requeue.js';
import { getRun } from '../db/runs.js';
import { completionLengthCounts, completionLengthCountsByVariant, recentCompleted } from '../db/samples.js';
import type { RunRow } from '../db/schema.js';
import { gateSettings } from '../domain/quality.js';
import { QUALITY_WINDOW } from '../domain/quality-window.js';
import { RunQuality } from '../domain/run-quality.js';
import type { FleetShare } from '../domain/live-view.js';
import type { RunStatus } from '../domain/statuses.js';
import type { EndpointPool, LiveEndpoint } from './endpoints.js';
import { checkGate, pauseForGate } from './gate.js';

/** What a run's checks are built with. */
const checksOf = (run: RunRow, quality: NonNullable<RunRow['quality']>) => ({
  min_completion_tokens: quality.min_completion_tokens,
  min_trainable_tokens: quality.min_trainable_tokens,
  model: run.model,
  variants: run.variants?.map((v) => v.name),
});

/** Runs whose flagged answers a quarantine asks again: the ones still taking work. */
const REQUEUE_STATUSES: readonly RunStatus[] = ['queued', 'in_progress', 'paused'];

/**
 * The quality gate over the runs being dispatched (README "The quality gate"): one RunQuality a
 * run, built on the run's first answer after a start from what the database kept (its latest
 * completed samples' flags, its completion lengths), so a restart judges as the process before it
 * did. After each commit it takes out of rotation an endpoint clearly worse than its peers, gives
 * its flagged answers back to be asked elsewhere, and pauses a run whose recent answers are over
 * the limit.
 */
export class QualityWatch {
  private readonly runs = new Map<string, RunQuality>();

  constructor(
    private readonly deps: RunnerDeps,
    private readonly pool: EndpointPool,
    /** Commits the answers already settled: a quarantine's requeue must see them. */
    private readonly commitResults: () => Promise<void>,
    /** PostgreSQL: what the other replicas publish of their quality windows. */
    private readonly remote: () => Pick<FleetShare, 'quality' | 'runWindows'>[] = () => [],
  ) {}

  /** Per run, the windows of the endpoints this process drives and its own window of the run, for the other replicas' gates. */
  share(): Required<Pick<FleetShare, 'quality' | 'runWindows'>> {
    const quality: NonNullable<FleetShare['quality']> = {};
    const runWindows: NonNullable<FleetShare['runWindows']> = {};
    for (const [runId, q] of this.runs) {
      for (const s of q.endpointShares()) if (this.pool.live.get(s.endpointId)?.driven) (quality[runId] ??= {})[s.endpointId] = [s.samples, s.flagged];
      const w = q.windowCounts();
      if (w.size) runWindows[runId] = [w.size, w.flagged];
    }
    return { quality, runWindows };
  }

  /**
   * Builds a run's checks from what the database kept, once per start: the runner calls it before
   * it dispatches the run, so every answer finds them ready.
   */
  async load(run: RunRow): Promise<void> {
    if (!run.quality || this.runs.has(run.id)) return;
    const [recent, lengths] = await Promise.all([
      recentCompleted(this.deps.db, run.id, QUALITY_WINDOW),
      run.variants?.length ? completionLengthCountsByVariant(this.deps.db, run.id) : completionLengthCounts(this.deps.db, run.id),
    ]);
    if (this.runs.has(run.id)) return;
    const q = new RunQuality(checksOf(run, run.quality));
    q.restore(recent, run.completed, lengths);
    this.runs.set(run.id, q);
  }

  qualityOf(run: RunRow): RunQuality | null {
    if (!run.quality) return null;
    let q = this.runs.get(run.id);
    if (!q) {
      // Not loaded (an answer after the run was forgotten): judged from this answer on.
      q = new RunQuality(checksOf(run, run.quality));
      this.runs.set(run.id, q);
    }
    return q;
  }

  /** A finished run's checks are dropped: they would otherwise stay in memory for the life of the process. */
  forget(runId: string): void {
    this.runs.delete(runId);
  }

  /** The verdict under way: one at a time, so each sees what the one before it did (a quarantine's endpoint out of the window). */
  private judging: Promise<unknown> = Promise.resolve();

  /** After a commit of `run`'s answers. Returns true when it paused the run. */
  judge(run: RunRow): Promise<boolean> {
    const verdict = this.judging.then(() => this.judgeNow(run));
    this.judging = verdict.catch(() => {});
    return verdict;
  }

  private async judgeNow(run: RunRow): Promise<boolean> {
    const gate = gateSettings(run);
    const q = this.runs.get(run.id);
    if (!gate || !q) return false;
    const own = this.inRotation(run.model);
    const remote = this.remote();
    // Endpoints another replica drives weigh as peers, as that one counts them; only this one's are judged here.
    const peers = remote.flatMap((r) =>
      Object.entries(r.quality?.[run.id] ?? {}).flatMap(([id, [size, flagged]]) => {
        const e = this.pool.live.get(id);
        return e && !own.has(id) && e.state === 'ready' && e.serves(run.model) ? [{ size, flagged }] : [];
      }),
    );
    // The run's gate over every replica's window of it.
    const windows = remote.flatMap((r) => {
      const w = r.runWindows?.[run.id];
      return w ? [{ size: w[0], flagged: w[1] }] : [];
    });
    const verdict = q.verdict(gate, own, peers, windows);
    for (const bad of verdict.quarantine) await this.quarantine(bad.endpointId, bad.reason);
    if (verdict.overLimit && verdict.reason && !run.gateOverridden && run.status === 'in_progress') {
      if (await pauseForGate(this.deps, run.id, verdict.reason)) return true;
    }
    // The run's whole share, as before the window: a slow drift that no window catches.
    return checkGate(this.deps, run);
  }

  /** The endpoints this process drives that can take a run's work now. */
  private inRotation(model: string): Set<string> {
    const ids = new Set<string>();
    for (const e of this.pool.live.values()) if (e.driven && e.state === 'ready' && e.serves(model)) ids.add(e.row.id);
    return ids;
  }

  private async quarantine(endpointId: string, reason: string): Promise<void> {
    const e = this.pool.live.get(endpointId);
    if (!e || e.state !== 'ready' || e.quarantining) return;
    // From here its answers are asked again elsewhere; those settled before are committed first,
    // so the requeue below finds every flagged answer it gave.
    e.quarantining = true;
    try {
      await this.commitResults();
      await this.quarantineNow(e, endpointId, reason);
    } catch (err) {
      // Rolled back: the endpoint is as the database still has it, not as the transaction left it in memory.
      await this.pool.reload(e).catch(() => {});
      throw err;
    } finally {
      e.quarantining = false;
    }
  }

  private async quarantineNow(e: LiveEndpoint, endpointId: string, reason: string): Promise<void> {
    const { db, logger, clock, config } = this.deps;
    const now = clock();
    // The state, the run events and the webhook events commit together, so none is lost to a crash.
    const affected = await db.tx(async (tx) => {
      if (!(await this.pool.setState(e, 'quarantined', reason, {}, e.row.state, tx))) return null;
      const runIds: string[] = [];
      for (const [runId, q] of this.runs) {
        const run = await getRun(tx, runId);
        if (!run || !e.serves(run.model)) continue;
        runIds.push(runId);
        await appendEvent(tx, runId, 'endpoint_quarantined', { endpoint_id: endpointId, reason }, now);
        // Its flagged answers are asked again on the endpoints still in rotation, in every run it
        // served that still takes work; a run being cancelled keeps what it has.
        if (REQUEUE_STATUSES.includes(run.status as RunStatus)) {
          const requeued = await requeueRunSamples(tx, runId, 'flagged', now, endpointId);
          if (requeued) logger.info({ run_id: runId, endpoint_id: endpointId, requeued }, 'flagged answers of a quarantined endpoint requeued');
        }
        // Back in rotation after a fix, it is judged on its new answers only.
        q.forgetEndpoint(endpointId);
      }
      // One event to the server's default URL naming every run it touched, and one to each of those runs' own webhooks.
      const data = (runs: string[]) => ({ id: endpointId, url: e.row.url, reason, run_ids: runs });
      if (config.webhookUrl) await enqueueEvent(tx, { runId: null, url: config.webhookUrl, type: 'endpoint.quarantined', data: data(runIds) }, now);
      for (const r of await runsWithOwnWebhook(tx, runIds))
        await enqueueEvent(tx, { runId: r.id, url: r.url, type: 'endpoint.quarantined', data: data([r.id]) }, now);
      return runIds;
    });
    if (affected) logger.warn({ endpoint_id: endpointId, url: e.row.url, reason, run_ids: affected }, 'endpoint quarantined');
  }
}
