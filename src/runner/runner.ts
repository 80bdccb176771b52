import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { RunnerDeps } from '../deps.js';
import { publishRunnerView, readRunnerLock, runnerLockOwner } from '../db/runner-lock.js';
import { getRun, listRunsByStatus, setStatusReason, transitionRun, validatingRunIds } from '../db/runs.js';
import { cancelPendingSamples, type ClaimOrder } from '../db/samples.js';
import type { RunRow } from '../db/schema.js';
import { ACTIVE_RUN_STATUSES, DISPATCHABLE_RUN_STATUSES, isDispatchable } from '../domain/statuses.js';
import { expireBatches } from './batch-expiry.js';
import { ClaimBuffer } from './claim-buffer.js';
import { claimSize, pickEndpoint } from './endpoint-choice.js';
import { EndpointPool } from './endpoints.js';
import { Coalesced } from './coalesced.js';
import { Finisher } from './finishing.js';
import { Forecasts } from './forecasts.js';
import { QualityWatch } from './quality-watch.js';
import { HEARTBEAT_MS, RunnerLock, RunnerLockedError } from './lock.js';
import { RateWindow } from './rates.js';
import { Requests } from './requests.js';
import { recover } from './recovery.js';
import { ResultWriter, type FlushReport } from './results.js';
import { IDLE_ENDPOINT, IDLE_PROGRESS, type EndpointLive, type RunnerRole, type RunnerSnapshot, type RunnerView, type RunProgress } from './view.js';

/** The loop's period: expiry, probes, run status and uploads are looked at this often. */
const TICK_MS = 100;
/** PostgreSQL: how often the live view is published for the other replicas, and read by them. */
const VIEW_MS = 1000;
/** PostgreSQL: how often runs left validating by a replica that died are looked for. */
const VALIDATION_SWEEP_MS = 10_000;
/**
 * PostgreSQL: samples are sent only while the lock was last confirmed this recently (each tick
 * confirms it). A process that was stalled (stopped, swapping, cut off from the database) wakes
 * with answers to handle before its first tick; until a tick confirms the lock is still its own,
 * it sends nothing, even from samples it had claimed before the stall. Another replica takes the
 * lock only after 15 s without a heartbeat, and heartbeats come every 5 s: any stall that lost
 * the lock lasted 10 s or more, past this fence, which slow ticks under load stay well within.
 */
const LOCK_FENCE_MS = 5000;
/** While stopping, how often in-flight requests and uploads are looked at (wall time: real timers end them). */
const STOP_POLL_MS = 50;
/** Starts the status_reason of a run that no endpoint can serve now. */
const WAITING_PREFIX = 'waiting for an endpoint:';
/** Past the grace period: the aborted requests' answers, then the last uploads, get this long. */
const ABORT_SLACK_MS = 2000;
const UPLOAD_SLACK_MS = 5000;

/**
 * How far ahead of its oldest open sample a length-aware run may dispatch, in shards: far enough
 * that the longest samples of the last stretch start waves before the end (a shard is 1,000
 * samples by default, several waves of a fleet), near enough that shards still close one after
 * another, at most this many late.
 */
const LOOKAHEAD_SHARDS = 2;

/** A dry run claims its slice only; a run with predicted lengths may take the longest first. */
function claimOrderOf(run: RunRow): ClaimOrder {
  if (run.dryRun) return 'slice_only';
  return run.dispatchOrder === 'length_aware' && run.predictedSamples > 0 ? 'length_aware' : 'input';
}

/**
 * The dispatcher, wired from its mechanisms: the lock, recovery, the claim buffer, endpoint
 * choice, request building and parsing, the failure policy, the result writer and the finisher.
 * It claims samples in shard order for the highest-priority runs, sends each to the ready endpoint
 * with the most free room for the run's model, and refills a slot as soon as it frees.
 */
export class Runner implements RunnerView {
  readonly owner = `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  readonly pool: EndpointPool;
  private readonly lock: RunnerLock;
  private readonly writer: ResultWriter;
  private readonly claims: ClaimBuffer;
  private readonly finisher: Finisher;
  private readonly requests: Requests;
  private readonly quality: QualityWatch;
  private readonly forecasts: Forecasts;
  private readonly runRates = new Map<string, RateWindow>();
  private active: RunRow[] = [];
  private timer: NodeJS.Timeout | null = null;
  private heartbeat: NodeJS.Timeout | null = null;
  /** PostgreSQL: the live view published for the replicas standing by, or read while this one stands by. */
  private viewTimer: NodeJS.Timeout | null = null;
  /** Another replica dispatches: this one watches the lock, serving the view that one publishes. */
  private standby = false;
  private published: RunnerSnapshot | null = null;
  /** The lock is held and recovery done: samples may be sent. */
  private dispatching = false;
  private watching = false;
  private sweptAt = 0;
  private stopping = false;
  private stopped: Promise<void> | null = null;
  /** performance.now() when the lock was last confirmed ours (PostgreSQL). */
  private confirmedAt = 0;
  private pumping = false;
  private woken = false;
  private ticking = false;
  private readonly refreshes = new Coalesced();

  /**
   * @param onDeposed PostgreSQL: called once dispatch has stopped because another replica took the
   *   lock (this one was stalled past the lock's staleness); the caller stands a fresh runner by.
   */
  constructor(
    private readonly deps: RunnerDeps,
    private readonly onDeposed?: () => void,
  ) {
    const { db, logger, clock, config } = deps;
    this.lock = new RunnerLock(db, this.owner, clock);
    this.pool = new EndpointPool(
      db,
      logger,
      clock,
      config,
      () => this.wake(),
      (e) => this.requests.abortEndpoint(e, 'release'),
    );
    this.writer = new ResultWriter(db, this.owner, logger, (r) => this.guard('after a result commit', () => this.afterFlush(r)), clock);
    this.claims = new ClaimBuffer(
      db,
      this.owner,
      clock,
      this.writer,
      () => this.guard('refilling slots', () => this.pump()),
      (err) => this.warn('claiming samples', err),
    );
    this.quality = new QualityWatch(deps, this.pool, () => this.writer.flush());
    this.forecasts = new Forecasts(deps, this.pool);
    this.requests = new Requests(deps, this.pool, this.writer, (what, step) => this.guard(what, step), {
      settled: () => {
        this.guard('refilling a slot', () => this.pump());
        // Batching commits only pays while answers keep coming; the last ones of a run need not
        // wait out the interval before their shard can close.
        if (this.requests.size === 0) void this.guard('committing results', () => this.writer.flush());
      },
      qualityOf: (run) => this.quality.qualityOf(run),
      answered: (run, endpointId, tokens, latencyMs, now) => this.forecasts.answered(run.id, endpointId, tokens, latencyMs, now),
    });
    this.finisher = new Finisher(deps, (what, step) => this.guard(what, step), {
      afterUpload: () => this.finisher.advance(this.active),
      // The last forecast is stored before the run leaves in_progress, so the finished run shows the
      // same one from every read: the API's view of the live one lags the status by a snapshot.
      // A dry run's is of the whole input still, as when its slice was answered.
      settled: async (run) => this.guard('the final forecast', () => this.forecasts.compute(run, this.deps.clock(), true)),
      afterFinish: (runId) => {
        this.quality.forget(runId);
        this.forecasts.forget(runId);
        // A finished run has no rate; its window would otherwise stay in memory for the life of the process.
        this.runRates.delete(runId);
        void this.guard('reading the active runs', () => this.refreshActive());
      },
    });
  }

  // ---- start and stop ----

  /** Takes the runner lock, returns a dead owner's leases to the queue, resumes validation, starts ticking. */
  async start(): Promise<void> {
    try {
      await this.lock.take();
    } catch (err) {
      // On SQLite a second process on one file is a mistake; on PostgreSQL it is a replica.
      if (!(err instanceof RunnerLockedError) || this.deps.db.dialect !== 'pg') throw err;
      if (this.stopping) return;
      this.deps.logger.info({ owner: this.owner, reason: err.message }, 'another replica dispatches: standing by to take over');
      this.standby = true;
      this.viewTimer = setInterval(() => void this.guard('standing by', () => this.watchLock()), VIEW_MS);
      return;
    }
    // Asked to stop while taking the lock: it goes back at once.
    if (this.stopping) return await this.lock.release();
    await this.begin();
  }

  /** With the lock held: a dead owner's leases back to the queue, then the loop. */
  private async begin(): Promise<void> {
    // Beating from the start: a long recovery must not let the lock go stale under it.
    this.heartbeat = setInterval(() => void this.guard('runner heartbeat', () => this.beat()), HEARTBEAT_MS);
    await recover(this.deps.db, this.deps.logger, this.deps.startIngest);
    await this.pool.sync();
    await this.refreshActive();
    // Deposed or asked to stop while recovering: no loop may start after stop() cleared the timers.
    if (this.stopping) return;
    this.confirmedAt = performance.now();
    this.dispatching = true;
    this.timer = setInterval(() => void this.tick(), TICK_MS);
    if (this.deps.db.dialect === 'pg') {
      this.viewTimer = setInterval(
        () => void this.guard('publishing the live view', () => publishRunnerView(this.deps.db, this.owner, this.snapshot())),
        VIEW_MS,
      );
    }
    void this.tick();
  }

  /** Standing by: reads the dispatching replica's view, and takes the lock over once its heartbeat is stale. */
  private async watchLock(): Promise<void> {
    // One look at a time: a slow database must not let two takeovers run.
    if (this.stopping || !this.standby || this.watching) return;
    this.watching = true;
    try {
      this.published = (await readRunnerLock(this.deps.db))?.view ?? null;
      try {
        await this.lock.take();
      } catch (err) {
        if (err instanceof RunnerLockedError) return;
        throw err;
      }
      if (this.stopping) return;
      if (this.viewTimer) clearInterval(this.viewTimer);
      this.viewTimer = null;
      this.standby = false;
      this.published = null;
      this.deps.logger.warn({ owner: this.owner }, 'the dispatching replica stopped beating: this replica takes over dispatch');
      try {
        await this.begin();
      } catch (err) {
        // Not half a dispatcher: the lock goes back, and this replica stands by again.
        this.dispatching = false;
        for (const t of [this.timer, this.heartbeat, this.viewTimer]) if (t) clearInterval(t);
        this.timer = this.heartbeat = this.viewTimer = null;
        await this.lock.release().catch(() => {});
        this.standby = true;
        this.viewTimer = setInterval(() => void this.guard('standing by', () => this.watchLock()), VIEW_MS);
        throw err;
      }
    } finally {
      this.watching = false;
    }
  }

  /** A tick still under way when the next is due lets that one pass: ticks never overlap. */
  private tick(): Promise<void> | undefined {
    if (this.ticking) return;
    this.ticking = true;
    return this.guard('runner tick', () => this.runOnce())?.finally(() => {
      this.ticking = false;
    });
  }

  private async beat(): Promise<void> {
    if (!(await this.lock.beat())) await this.deposed();
  }

  /**
   * Another process took the lock over (this one missed its heartbeats: a stalled process, a cut
   * network): two dispatchers would send samples twice, so this one stops at once. Its leases were
   * returned by the new holder, and its commits are refused by their owner checks.
   */
  private async deposed(): Promise<void> {
    if (this.stopping) return;
    this.deps.logger.error({ owner: this.owner }, 'the runner lock was taken by another process; dispatch stops');
    await this.stop(0);
    this.onDeposed?.();
  }

  /** Stops dispatch, lets in-flight requests finish for the grace period, releases the rest, flushes. A second call waits for the first. */
  stop(graceMs: number): Promise<void> {
    this.stopped ??= this.stopNow(graceMs);
    return this.stopped;
  }

  private async stopNow(graceMs: number): Promise<void> {
    this.stopping = true;
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
    if (this.heartbeat) clearInterval(this.heartbeat);
    if (this.viewTimer) clearInterval(this.viewTimer);
    await this.writer.close();
    this.pool.close();
    await until(() => this.finisher.busy === 0, deadline + UPLOAD_SLACK_MS);
    // Left behind, the lock goes stale within LOCK_STALE_MS: not worth failing a clean shutdown for.
    await this.guard('releasing the runner lock', () => this.lock.release());
  }

  /** The last-resort path of a second signal: commit what is known, leave the rest to recovery. */
  async flushNow(): Promise<void> {
    await this.guard('committing results', () => this.writer.flush());
  }

  // ---- RunnerView ----

  runProgress(runId: string): RunProgress {
    if (this.standby) return this.published?.runs[runId] ?? IDLE_PROGRESS;
    const r = this.runRates.get(runId)?.rates(this.deps.clock());
    const forecast = this.forecasts.get(runId);
    if (!r) return forecast ? { ...IDLE_PROGRESS, forecast } : IDLE_PROGRESS;
    return { samples_per_second: r.samples, completion_tokens_per_second: r.tokens, forecast };
  }

  endpointLive(endpointId: string): EndpointLive {
    if (this.standby) return this.published?.endpoints[endpointId] ?? IDLE_ENDPOINT;
    return this.pool.liveOf(endpointId, this.deps.clock());
  }

  role(): RunnerRole {
    if (this.standby) return 'standby';
    return this.dispatching && !this.stopping ? 'dispatching' : 'stopped';
  }

  /** Every run's rates and every live endpoint's state at once, for the API thread to read from. */
  snapshot(): RunnerSnapshot {
    // Standing by, the view is the dispatcher's, the role this process's own.
    if (this.standby) return { runs: {}, endpoints: {}, ...this.published, role: 'standby' };
    const runs: RunnerSnapshot['runs'] = {};
    for (const run of this.active) runs[run.id] = this.runProgress(run.id);
    return { runs, endpoints: this.pool.snapshot(this.deps.clock()), role: this.role() };
  }

  wake(): void {
    // A replica standing by dispatches nothing; the one that does sees the change on its next tick.
    if (this.woken || this.stopping || !this.dispatching) return;
    this.woken = true;
    queueMicrotask(() => {
      this.woken = false;
      void this.guard('runner wake', async () => {
        await this.pool.sync();
        await this.refreshActive();
        this.pump();
      });
    });
  }

  get inFlight(): number {
    return this.requests.size;
  }

  // ---- the loop ----

  /**
   * Runs one step of the loop that the database may refuse (SQLITE_BUSY once busy_timeout is spent,
   * while another process holds the write lock): the step is logged and the next tick does it
   * again, instead of an exception from a timer taking the whole process down.
   */
  private guard<T>(what: string, step: () => T): T | undefined {
    try {
      const result = step();
      // An async step's failure is caught the same way: the promise handed back never rejects.
      if (result instanceof Promise) return result.catch((err: unknown) => this.warn(what, err)) as T;
      return result;
    } catch (err) {
      this.warn(what, err);
      return undefined;
    }
  }

  private warn(what: string, err: unknown): undefined {
    this.deps.logger.warn({ err: { message: (err as Error).message, code: (err as { code?: unknown }).code } }, `${what} failed; retrying`);
    return undefined;
  }

  /** One turn of the loop: probes, batch expiry, the active runs, dispatch, uploads and finishing. Tests may call it to step the loop. */
  async runOnce(): Promise<void> {
    if (this.stopping) return;
    if (this.deps.db.dialect === 'pg') {
      // A heartbeat comes every 5 s; a replica that took the lock over meanwhile must not see this
      // one upload, finish or claim for that long.
      if ((await runnerLockOwner(this.deps.db)) !== this.owner) return await this.deposed();
      this.confirmedAt = performance.now();
      // Other replicas register and change endpoints without waking this one.
      await this.pool.sync();
      await this.sweepValidations();
    }
    this.pool.probeDue();
    await expireBatches(this.deps);
    await this.refreshActive();
    this.claims.newTick();
    this.pump();
    await this.forecasts.update(this.active);
    await this.endDryRuns();
    await this.finisher.advance(this.active);
  }

  /**
   * PostgreSQL: a run left `validating` by a replica that died is validated again here. Asking for
   * a run another replica still validates costs one refused hold (services/runs/ingest.ts).
   */
  private async sweepValidations(): Promise<void> {
    const now = this.deps.clock();
    if (now - this.sweptAt < VALIDATION_SWEEP_MS) return;
    this.sweptAt = now;
    for (const id of await validatingRunIds(this.deps.db)) this.deps.startIngest(id);
  }

  /**
   * A dry run whose slice is all answered (or failed) ends: its final forecast, of the whole input,
   * is stored, and the samples outside the slice are cancelled, so the finisher writes the slice's
   * shards and completes the run.
   */
  private async endDryRuns(): Promise<void> {
    for (const run of this.active) {
      if (!run.dryRun || (run.status !== 'in_progress' && run.status !== 'queued') || run.pending === 0) continue;
      if ((await this.forecasts.slice(run.id)).open > 0) continue;
      // A dry run paused once its slice was all claimed comes back queued with nothing left for a
      // claim to take, and a claim is what moves a run to in_progress: this ends it instead.
      await this.started(run);
      await this.forecasts.compute(run, this.deps.clock(), true);
      await cancelPendingSamples(this.deps.db, run.id);
      this.deps.logger.info({ run_id: run.id }, 'dry run: calibration slice answered');
    }
  }

  /** Reads the active runs again; reads never overlap (one asked for meanwhile follows). */
  private refreshActive(): Promise<void> {
    return this.refreshes.run(() => this.readActive());
  }

  private async readActive(): Promise<void> {
    const active = await listRunsByStatus(this.deps.db, ACTIVE_RUN_STATUSES);
    // Each run's quality checks are built before the run is dispatched, so every answer finds them.
    for (const r of active) if (isDispatchable(r.status)) await this.quality.load(r);
    this.active = active;
    // Claimed samples wait in a buffer only while some endpoint can take them; otherwise they
    // would sit `in_progress` for as long as the fleet is down.
    const dispatchable = new Set<string>();
    for (const r of this.active) {
      if (!isDispatchable(r.status)) continue;
      const served = this.pool.servesNow(r.model);
      if (served) dispatchable.add(r.id);
      await this.sayWhyWaiting(r, served);
    }
    for (const runId of [...this.claims.runs()]) if (!dispatchable.has(runId)) this.claims.release(runId);
    for (const f of this.requests.all()) {
      const run = this.active.find((r) => r.id === f.run.id);
      if (!run || run.status === 'cancelling') this.requests.abort(f, 'cancel');
    }
  }

  /** Fills every free slot now. Called after each outcome, on wake and on every tick. */
  private pump(): void {
    if (this.pumping || this.stopping || !this.dispatching) return;
    if (this.deps.db.dialect === 'pg' && performance.now() - this.confirmedAt > LOCK_FENCE_MS) return;
    this.pumping = true;
    try {
      // Caps do not move within one pump; endpoints with free slots but no sample for them leave it.
      const caps = new Map<string, number>();
      for (const e of this.pool.live.values()) if (e.dispatchable) caps.set(e.row.id, this.pool.capOf(e));
      for (;;) {
        const best = pickEndpoint(this.pool.live.values(), (e) => {
          const cap = caps.get(e.row.id);
          return cap === undefined ? null : { cap, inFlight: e.inFlight.size, weight: e.row.weight };
        });
        if (!best) break;
        let sent = false;
        for (const run of this.active) {
          if (!isDispatchable(run.status) || !best.serves(run.model) || this.claims.isDrained(run.id)) continue;
          const sample = this.claims.take(
            run.id,
            () => this.claimSizeFor(run.model),
            () => void this.guard('starting a run', () => this.started(run)),
            claimOrderOf(run),
            LOOKAHEAD_SHARDS * run.shardSize,
          );
          if (!sample) {
            // A run ahead in the order whose claim is under way keeps the slot: its claim lands in
            // milliseconds, where a run behind it would hold the slot for a whole request. Each
            // refill of a high-priority run would otherwise hand a lower one the slots that free
            // meanwhile (a third of the fleet, measured: test/replicas.test.ts).
            if (this.claims.isClaiming(run.id)) break;
            continue;
          }
          this.requests.send(best, run, sample);
          sent = true;
          break;
        }
        if (!sent) caps.delete(best.row.id);
      }
    } finally {
      this.pumping = false;
    }
  }

  private claimSizeFor(model: string): number {
    const { free, total } = this.pool.slotsFor(model);
    return claimSize(free, total);
  }

  /**
   * A run no dispatchable endpoint serves says so in its status_reason, with what the endpoints
   * serve, so that a name mismatch or a fleet still loading is seen at once; the reason goes when
   * an endpoint serves it.
   */
  private async sayWhyWaiting(run: RunRow, served: boolean): Promise<void> {
    const ours = run.statusReason?.startsWith(WAITING_PREFIX) ?? false;
    const reason = served ? null : `${WAITING_PREFIX} no ready endpoint serves model ${JSON.stringify(run.model)}; ${this.pool.describeServed()}`;
    if (reason === run.statusReason || (served && !ours) || (!served && run.statusReason && !ours)) return;
    if (await setStatusReason(this.deps.db, run.id, reason, DISPATCHABLE_RUN_STATUSES)) {
      if (reason) this.deps.logger.warn({ run_id: run.id, model: run.model, reason }, 'run waits for an endpoint');
      run.statusReason = reason;
    }
  }

  /** A run's first claim moves it from queued to in_progress. */
  private async started(run: RunRow): Promise<void> {
    if (run.status !== 'queued') return;
    const at = this.deps.clock();
    run.status = 'in_progress';
    if (await transitionRun(this.deps.db, run.id, ['queued'], 'in_progress', at, run.startedAt ? {} : { startedAt: at })) {
      this.deps.logger.info({ run_id: run.id, status: 'in_progress' }, 'run status');
    }
  }

  // ---- after each commit ----

  private async afterFlush(r: FlushReport): Promise<void> {
    const now = this.deps.clock();
    for (const [runId, d] of r.runs) {
      if (d.completed) {
        let w = this.runRates.get(runId);
        if (!w) this.runRates.set(runId, (w = new RateWindow()));
        w.add(now, d.completed, d.tokens);
      }
      const run = await getRun(this.deps.db, runId);
      if (run && (await this.quality.judge(run))) {
        this.claims.release(runId);
        await this.refreshActive();
      }
    }
    if (r.closedShards.length) await this.finisher.advance(this.active);
  }
}
