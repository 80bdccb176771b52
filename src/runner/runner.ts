import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { RunnerDeps } from '../deps.js';
import { getRun, listRunsByStatus } from '../db/runs.js';
import type { RunRow } from '../db/schema.js';
import { ACTIVE_RUN_STATUSES, isDispatchable } from '../domain/statuses.js';
import { ClaimBuffer } from './claim-buffer.js';
import { Coalesced } from './coalesced.js';
import { AFFINITY_WAIT_MS } from './endpoint-choice.js';
import { EndpointProbes } from './endpoint-probes.js';
import { EndpointPool } from './endpoints.js';
import { Finisher } from './finishing.js';
import type { Fleet } from './fleet/fleet.js';
import { createFleet } from './fleet/index.js';
import { Forecasts } from './forecasts.js';
import { HistoryRecorder } from './history.js';
import { guardWith, warnRetrying, type Guard } from './guard.js';
import { move, type Life } from './life.js';
import { RunnerLock } from './lock.js';
import { fillSlots } from './pump.js';
import { QualityWatch } from './quality-watch.js';
import { RateWindow } from './rates.js';
import { inFlightByRun } from './choices.js';
import { Requests } from './requests.js';
import { ResultWriter, type FlushReport } from './results.js';
import { RunSteps } from './run-steps.js';
import {
  IDLE_ENDPOINT,
  IDLE_PROGRESS,
  type EndpointLive,
  type RunnerRole,
  type RunnerSnapshot,
  type RunnerView,
  type RunProgress,
} from '../domain/live-view.js';

/** The loop's period: expiry, probes, run status and uploads are looked at this often. */
const TICK_MS = 100;
/** While stopping, how often in-flight requests and uploads are looked at (wall time: real timers end them). */
const STOP_POLL_MS = 50;
/** Past the grace period: the aborted requests' answers, then the last uploads, get this long. */
const ABORT_SLACK_MS = 2000;
const UPLOAD_SLACK_MS = 5000;

/**
 * The dispatcher, wired from its mechanisms: the fleet (how this process takes part in dispatch:
 * fleet/), recovery, the claim buffer, endpoint choice, request building and parsing, the failure
 * policy, the result writer and the finisher. It claims samples in shard order for the
 * highest-priority runs, sends each to the ready endpoint with the most free room for the run's
 * model, and refills a slot as soon as it frees. The run-level steps (expiry, forecasts, dry-run
 * ends, uploads, finishing) are done by the process the fleet says leads.
 */
export class Runner implements RunnerView {
  readonly owner = `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  readonly pool: EndpointPool;
  private readonly probes: EndpointProbes;
  private readonly fleet: Fleet;
  private readonly writer: ResultWriter;
  private readonly claims: ClaimBuffer;
  private readonly finisher: Finisher;
  private readonly requests: Requests;
  private readonly quality: QualityWatch;
  private readonly forecasts: Forecasts;
  private readonly history: HistoryRecorder;
  private readonly runSteps: RunSteps;
  private readonly runRates = new Map<string, RateWindow>();
  private readonly guard: Guard;
  private active: RunRow[] = [];
  private timer: NodeJS.Timeout | null = null;
  /** The runner's life (life.ts): only `running` claims, sends and wakes. */
  private life: Life = 'idle';
  /** The join under way while `starting`: a stop waits for it, then leaves. */
  private joining: Promise<void> | null = null;
  private stopped: Promise<void> | null = null;
  /** A pump is under way: a slot freed by a send that settles at once is filled by that same pump's loop. */
  private pumping = false;
  /** A wake is queued for the next microtask: the wakes of one turn of the event loop make one. */
  private woken = false;
  /** A tick is under way: the next one due meanwhile is skipped, so ticks never overlap. */
  private ticking = false;
  private readonly refreshes = new Coalesced();

  /**
   * @param onDeposed called once dispatch has stopped because another process took the lock over
   *   or took this replica for dead (it was stalled past their staleness); the caller starts a fresh runner.
   */
  constructor(
    private readonly deps: RunnerDeps,
    private readonly onDeposed?: () => void,
  ) {
    const { db, logger, clock, config } = deps;
    this.guard = guardWith(logger);
    this.pool = new EndpointPool(
      db,
      logger,
      clock,
      config,
      () => this.wake(),
      (e) => this.requests.abortEndpoint(e, 'release'),
    );
    this.probes = new EndpointProbes(
      this.pool,
      logger,
      clock,
      config,
      () => this.wake(),
      (e) => this.requests.abortEndpoint(e, 'release'),
    );
    this.fleet = createFleet(deps, this.owner, new RunnerLock(db, this.owner, clock, config.replicaStaleMs), this.pool, {
      publish: () => this.ownSnapshot(true),
      deposed: (why) => this.deposed(why),
      guard: async (what, step) => {
        await this.guard(what, step);
      },
    });
    this.writer = new ResultWriter(db, this.owner, logger, (r) => this.guard('after a result commit', () => this.afterFlush(r)), clock);
    this.claims = new ClaimBuffer(
      db,
      this.owner,
      clock,
      this.writer,
      () => this.guard('refilling slots', () => this.pump()),
      (err) => warnRetrying(logger, 'claiming samples', err),
      () => this.pool.drivesOnly(),
      // Without affinity a sample waits for no endpoint, whichever replica drives it.
      config.affinity ? AFFINITY_WAIT_MS : 0,
    );
    this.quality = new QualityWatch(
      deps,
      this.pool,
      () => this.writer.flush(),
      () => this.fleet.peerShares(),
    );
    this.forecasts = new Forecasts(deps, this.pool, this.fleet, () => this.requests.all());
    this.history = new HistoryRecorder(
      deps,
      () => this.snapshot(),
      () => ({ ...this.fleet.peersShare().caps, ...this.forecasts.share(deps.clock()).caps }),
    );
    this.runSteps = new RunSteps(deps, this.pool, this.forecasts);
    this.requests = new Requests(deps, this.pool, this.writer, this.guard, {
      settled: () => {
        this.guard('refilling a slot', () => this.pump());
        // Batching commits only pays while answers keep coming; the last ones of a run need not
        // wait out the interval before their shard can close.
        if (this.requests.size === 0) void this.guard('committing results', () => this.writer.flush());
      },
      qualityOf: (run) => this.quality.qualityOf(run),
      answered: (run, endpointId, tokens, latencyMs, now) => this.forecasts.answered(run.id, endpointId, tokens, latencyMs, now),
    });
    this.finisher = new Finisher(deps, this.guard, {
      afterUpload: () => this.finisher.advance(this.active),
      // The last forecast is stored before the run leaves in_progress, so the finished run shows the
      // same one from every read: the API's view of the live one lags the status by a snapshot.
      // A dry run's is of the whole input still, as when its slice was answered.
      settled: async (run) => this.guard('the final forecast', () => this.forecasts.compute(run, this.deps.clock(), true)),
      afterFinish: (runId) => {
        this.forgetRun(runId);
        void this.guard('reading the active runs', () => this.refreshActive());
      },
    });
  }

  // ---- start and stop ----

  /** Joins the fleet (the lock, or a replica's row; recovery when it leads), reads the active runs, starts ticking. */
  async start(): Promise<void> {
    if (this.life !== 'idle') return;
    this.life = move(this.life, 'starting');
    try {
      await (this.joining = this.join());
    } catch (err) {
      // Not half a runner: timers, the lock and the replica's row go, then the caller hears why.
      await this.stop(0).catch(() => {});
      throw err;
    }
    // Asked to stop while joining: no loop may start after stop() left.
    if (this.life !== 'starting') return;
    this.life = move(this.life, 'running');
    this.timer = setInterval(() => void this.tick(), TICK_MS);
    void this.tick();
  }

  private async join(): Promise<void> {
    await this.fleet.join();
    await this.refreshActive();
  }

  /** A tick still under way when the next is due lets that one pass: ticks never overlap. */
  private tick(): Promise<void> | undefined {
    if (this.ticking) return;
    this.ticking = true;
    return this.guard('runner tick', () => this.runOnce())?.finally(() => {
      this.ticking = false;
    });
  }

  /**
   * Another process took the lock over, or took this replica for dead: this one missed its
   * heartbeats (a stalled process, a cut network), and its leases were or will be returned to the
   * queue, so it stops at once; its commits are refused by their owner checks.
   */
  private deposed(why: string): void {
    if (this.life !== 'starting' && this.life !== 'running') return;
    this.deps.logger.error({ owner: this.owner }, `${why}; dispatch stops`);
    void this.stop(0).then(() => this.onDeposed?.());
  }

  /** Stops dispatch, lets in-flight requests finish for the grace period, releases the rest, flushes. A second call waits for the first. */
  stop(graceMs: number): Promise<void> {
    this.stopped ??= this.stopNow(graceMs);
    return this.stopped;
  }

  private async stopNow(graceMs: number): Promise<void> {
    this.life = move(this.life, 'stopping');
    await this.joining?.catch(() => {});
    this.fleet.drain();
    await this.claims.releaseAll();
    // Wall time, not deps.clock(): the grace period is real seconds that real requests get to finish in.
    const deadline = Date.now() + graceMs;
    const until = async (done: () => boolean, at: number) => {
      while (!done() && Date.now() < at) await new Promise((r) => setTimeout(r, STOP_POLL_MS));
    };
    await until(() => this.requests.size === 0, deadline);
    for (const f of this.requests.all()) this.requests.abort(f, 'release');
    await until(() => this.requests.size === 0, deadline + ABORT_SLACK_MS);
    if (this.timer) clearInterval(this.timer);
    await this.writer.close();
    this.pool.close();
    await until(() => this.finisher.busy === 0, deadline + UPLOAD_SLACK_MS);
    await this.fleet.leave();
    this.life = move(this.life, 'stopped');
  }

  /** The last-resort path of a second signal: commit what is known, leave the rest to recovery. */
  async flushNow(): Promise<void> {
    await this.guard('committing results', () => this.writer.flush());
  }

  // ---- RunnerView ----

  runProgress(runId: string): RunProgress {
    return this.snapshot().runs[runId] ?? IDLE_PROGRESS;
  }

  endpointLive(endpointId: string): EndpointLive {
    return this.snapshot().endpoints[endpointId] ?? IDLE_ENDPOINT;
  }

  role(): RunnerRole {
    return this.life === 'running' ? this.fleet.role() : 'stopped';
  }

  /** This process's own rates, endpoints and forecasts; `withFleet`, what the other replicas need of its endpoints too (what it publishes). */
  private ownSnapshot(withFleet = false): RunnerSnapshot {
    const now = this.deps.clock();
    const runs: RunnerSnapshot['runs'] = {};
    const inFlight = inFlightByRun(this.requests.all());
    for (const run of this.active) {
      const r = this.runRates.get(run.id)?.rates(now);
      const forecast = this.forecasts.get(run.id);
      const [in_flight, samples_in_flight] = inFlight.get(run.id) ?? [0, 0];
      const counts = { in_flight, samples_in_flight, turned_away: this.requests.turnedAway.get(run.id), without_ids: this.pool.withoutIds(run) };
      if (!r && !forecast && !in_flight && !counts.turned_away && !counts.without_ids) continue;
      runs[run.id] = r
        ? { samples_per_second: r.samples, completion_tokens_per_second: r.tokens, turns_per_second: r.turns, forecast, ...counts }
        : { ...IDLE_PROGRESS, forecast, ...counts };
    }
    const own: RunnerSnapshot = { runs, endpoints: this.pool.snapshot(now), role: this.role() };
    if (withFleet) own.fleet = { ...this.forecasts.share(now), ...this.quality.share() };
    return own;
  }

  /** Every run's rates and every live endpoint's state at once, for the API thread to read from: the whole fleet's. */
  snapshot(): RunnerSnapshot {
    return this.fleet.merge(this.ownSnapshot());
  }

  wake(): void {
    if (this.woken || this.life !== 'running') return;
    this.woken = true;
    queueMicrotask(() => {
      this.woken = false;
      void this.guard('runner wake', async () => {
        await this.pool.sync();
        await this.fleet.woken();
        await this.refreshActive();
        this.pump();
      });
    });
  }

  get inFlight(): number {
    return this.requests.size;
  }

  // ---- the loop ----

  /** One turn of the loop: probes, batch expiry, the active runs, dispatch, uploads and finishing. Tests may call it to step the loop. */
  async runOnce(): Promise<void> {
    if (this.life !== 'running') return;
    await this.fleet.tick();
    // Deposed meanwhile: nothing more from this process.
    if (this.life !== 'running') return;
    this.probes.due();
    const leads = this.fleet.leads;
    if (leads) await this.runSteps.expireBatches();
    await this.refreshActive();
    this.claims.newTick();
    this.pump();
    if (!leads) return;
    await this.forecasts.update(this.active);
    await this.runSteps.endDryRuns(this.active);
    await this.finisher.advance(this.active);
    await this.history.tick();
  }

  /** Reads the active runs again; reads never overlap (one asked for meanwhile follows). */
  private refreshActive(): Promise<void> {
    return this.refreshes.run(() => this.readActive());
  }

  private async readActive(): Promise<void> {
    const active = await listRunsByStatus(this.deps.db, ACTIVE_RUN_STATUSES);
    // What was learned of a run that left goes with it (where the runs finish, the finisher forgets them first).
    const ids = new Set(active.map((r) => r.id));
    for (const gone of this.active.filter((r) => !ids.has(r.id))) {
      this.forgetRun(gone.id);
      void this.guard("removing an ended run's temp folder", () => this.finisher.removeTemp(gone));
    }
    // Each run's quality checks are built before the run is dispatched, so every answer finds them.
    for (const r of active) if (isDispatchable(r.status)) await this.quality.load(r);
    this.active = active;
    // Claimed samples wait in a buffer only while some endpoint can take them; otherwise they
    // would sit `in_progress` for as long as the fleet is down.
    const dispatchable = new Set<string>();
    for (const r of this.active) {
      if (!isDispatchable(r.status)) continue;
      if (this.pool.servesNow(r)) dispatchable.add(r.id);
      // Whether any process can serve it: the leading one says so once for all.
      if (this.fleet.leads) await this.runSteps.sayWhyWaiting(r, this.pool.servedAnywhere(r.model), this.active);
    }

    for (const runId of [...this.claims.runs()]) if (!dispatchable.has(runId)) this.claims.release(runId);
    // Only a cancel ends a sample; a run that left otherwise (failed by its uploads or its quality)
    // gets its requests back as pending, so that a retry sends them rather than losing them.
    for (const f of this.requests.all()) {
      const run = this.active.find((r) => r.id === f.run.id);
      if (run?.status === 'cancelling') this.requests.abort(f, 'cancel');
      else if (!run) this.requests.abort(f, 'release');
    }
  }

  /** A finished run's checks, forecast and rate would otherwise stay in memory for the life of the process. */
  private forgetRun(runId: string): void {
    this.quality.forget(runId);
    this.forecasts.forget(runId);
    this.runRates.delete(runId);
    this.requests.turnedAway.delete(runId);
    this.finisher.forget(runId);
  }

  /** Fills every free slot now. Called after each outcome, on wake and on every tick. */
  private pump(): void {
    if (this.pumping || this.life !== 'running' || !this.fleet.maySend()) return;
    this.pumping = true;
    try {
      const started = (run: RunRow) => void this.guard('starting a run', () => this.runSteps.started(run));
      fillSlots(this.pool, this.claims, this.requests, this.active, started, this.deps.config.affinity);
    } finally {
      this.pumping = false;
    }
  }

  // ---- after each commit ----

  private async afterFlush(r: FlushReport): Promise<void> {
    const now = this.deps.clock();
    for (const [runId, d] of r.runs) {
      if (d.completed || d.turnsAnswered) {
        let w = this.runRates.get(runId);
        if (!w) this.runRates.set(runId, (w = new RateWindow()));
        w.add(now, d.completed, d.tokens, d.turnsAnswered);
      }
      const run = await getRun(this.deps.db, runId);
      if (run && (await this.quality.judge(run))) {
        this.claims.release(runId);
        await this.refreshActive();
      }
    }
    if (r.closedShards.length && this.fleet.leads) await this.finisher.advance(this.active);
    // Conversations moved on to their next turn are due now, not at the next tick.
    if ([...r.runs.values()].some((d) => d.turns)) {
      for (const [runId, d] of r.runs) if (d.turns) this.claims.due(runId);
      this.pump();
    }
  }
}
