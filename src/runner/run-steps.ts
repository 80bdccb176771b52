import { idsReason } from './id-probe.js';
import type { RunnerDeps } from '../deps.js';
import { setStatusReason, transitionRun } from '../db/runs.js';
import { cancelPendingSamples, dropCancelledSamples } from '../db/samples.js';
import type { RunRow } from '../db/schema.js';
import { DISPATCHABLE_RUN_STATUSES } from '../domain/statuses.js';
import type { EndpointPool } from './endpoints.js';
import type { Forecasts } from './forecasts.js';
import { BUSY_REASON } from '../domain/turned-away.js';
import { expireBatches } from './batch-expiry.js';

/** Starts the status_reason of a run that no endpoint can serve now. */
const WAITING_PREFIX = 'waiting for an endpoint:';
/** Starts the status_reason of a queued run whose endpoints are all taken by a run ahead of it in the order. */
const BEHIND_PREFIX = 'waiting behind';

/**
 * Batches past their completion window are looked for at most this often, not on each of the
 * runner's ten ticks a second: a window is hours long, and an idle server took a tenth less CPU
 * (0.75–0.84 against 0.85–0.89 s of CPU in 30 s, three pairs alternating).
 */
const BATCH_EXPIRY_MS = 1000;

/** The moves of a run's status and reason that dispatch itself makes: started, waiting, a dry run's end, a batch's expiry. */
export class RunSteps {
  /** When batches past their window were last looked for (the clock's ms). */
  private batchesAt = -Infinity;

  constructor(
    private readonly deps: RunnerDeps,
    private readonly pool: EndpointPool,
    private readonly forecasts: Forecasts,
  ) {}

  /** Expires the batches whose completion window has passed (batch-expiry.ts), at most once a BATCH_EXPIRY_MS. */
  async expireBatches(): Promise<void> {
    const now = this.deps.clock();
    // A clock set back looks again at once rather than after the time it went back.
    if (now >= this.batchesAt && now - this.batchesAt < BATCH_EXPIRY_MS) return;
    this.batchesAt = now;
    await expireBatches(this.deps);
  }

  /**
   * A dry run whose slice is all answered (or failed) ends: its final forecast, of the whole input,
   * is stored, and the samples outside the slice are cancelled, so the finisher writes the slice's
   * shards and completes the run.
   */
  async endDryRuns(active: readonly RunRow[]): Promise<void> {
    for (const run of active) {
      if (!run.dryRun || (run.status !== 'in_progress' && run.status !== 'queued') || run.pending === 0) continue;
      if ((await this.forecasts.slice(run.id)).open > 0) continue;
      // A dry run paused once its slice was all claimed comes back queued with nothing left for a
      // claim to take, and a claim is what moves a run to in_progress: this ends it instead.
      await this.started(run);
      await this.forecasts.compute(run, this.deps.clock(), true);
      await cancelPendingSamples(this.deps.db, run.id);
      await dropCancelledSamples(this.deps.db, run.id);
      this.deps.logger.info({ run_id: run.id }, 'dry run: calibration slice answered');
    }
  }

  /**
   * A run no dispatchable endpoint serves says so in its status_reason, with what the endpoints
   * serve, so that a name mismatch or a fleet still loading is seen at once; the reason goes when
   * an endpoint serves it. One whose endpoints only turn it away for a while (429, a gateway's
   * shedding) says they are busy with other traffic. A queued run that is served but gets no slot
   * names the run ahead of it in the order (`active`: priority, then age) that holds them.
   */
  async sayWhyWaiting(run: RunRow, served: boolean, active: readonly RunRow[]): Promise<void> {
    const ours = [WAITING_PREFIX, BEHIND_PREFIX].some((p) => run.statusReason?.startsWith(p));
    const busy = !served && this.pool.turnedAwayOnly(run.model);
    // A run that writes token ids waits, too, while the endpoints serving it return none.
    const noIds = served && run.outputTokens ? idsReason(this.pool.live.values(), run.model) : null;
    // Behind another only while no slot serving it is free here (a free one is filled this same tick).
    const ahead =
      served && noIds === null && run.status === 'queued' && this.pool.slotsFor(run.model).free === 0
        ? active.slice(0, active.indexOf(run)).find((a) => a.status === 'in_progress' && this.pool.sharedBy(a.model, run.model))
        : undefined;
    const waits = !served || noIds !== null || ahead !== undefined;
    const reason = !waits
      ? null
      : ahead
        ? `${BEHIND_PREFIX} run ${ahead.id}${ahead.name ? ` (${JSON.stringify(ahead.name)})` : ''}, ahead of it in the order (priority ${ahead.priority}, then age): it holds the slots of the endpoints serving model ${JSON.stringify(run.model)}`
        : noIds
          ? `${WAITING_PREFIX} ${noIds}`
          : busy
            ? `${WAITING_PREFIX} ${BUSY_REASON}`
            : `${WAITING_PREFIX} no ready endpoint serves model ${JSON.stringify(run.model)}; ${this.pool.describeServed()}`;
    if (reason === run.statusReason || (!waits && !ours) || (waits && run.statusReason && !ours)) return;
    if (await setStatusReason(this.deps.db, run.id, reason, DISPATCHABLE_RUN_STATUSES)) {
      if (reason) this.deps.logger.warn({ run_id: run.id, model: run.model, reason }, 'run waits for an endpoint');
      run.statusReason = reason;
    }
  }

  /** A run's first claim moves it from queued to in_progress. */
  async started(run: RunRow): Promise<void> {
    if (run.status !== 'queued') return;
    const at = this.deps.clock();
    run.status = 'in_progress';
    if (await transitionRun(this.deps.db, run.id, ['queued'], 'in_progress', at, run.startedAt ? {} : { startedAt: at })) {
      this.deps.logger.info({ run_id: run.id, status: 'in_progress' }, 'run status');
    }
  }
}
