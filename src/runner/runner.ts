import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { RunnerDeps } from '../deps.js';
import {
  balanceEndpoints,
  beatReplica,
  leaveReplica,
  readReplicas,
  registerReplica,
  releaseDriver,
  removeReplicas,
  REPLICA_STALE_MS,
  type ReplicaRow,
} from '../db/replicas.js';
import { runnerLockOwner } from '../db/runner-lock.js';
import { getRun, listRunsByStatus, setStatusReason, transitionRun, validatingRunIds } from '../db/runs.js';
import { cancelPendingSamples, dropCancelledSamples, type ClaimOrder } from '../db/samples.js';
import type { RunRow } from '../db/schema.js';
import { ACTIVE_RUN_STATUSES, DISPATCHABLE_RUN_STATUSES, isDispatchable } from '../domain/statuses.js';
import { expireBatches } from './batch-expiry.js';
import { ClaimBuffer } from './claim-buffer.js';
import { claimSize, pickEndpoint } from './endpoint-choice.js';
import { EndpointPool } from './endpoints.js';
import { Coalesced } from './coalesced.js';
import { Finisher } from './finishing.js';
import { Forecasts } from './forecasts.js';
import { HistoryRecorder } from './history.js';
import { QualityWatch } from './quality-watch.js';
import { HEARTBEAT_MS, pidAlive, RunnerLock, RunnerLockedError } from './lock.js';
import { RateWindow } from './rates.js';
import { Requests } from './requests.js';
import { recover, releaseLeftLeases } from './recovery.js';
import { ResultWriter, type FlushReport } from './results.js';
import { IDLE_ENDPOINT, IDLE_PROGRESS, type EndpointLive, type RunnerRole, type RunnerSnapshot, type RunnerView, type RunProgress } from './view.js';
import type { FleetShare } from '../domain/live-view.js';

/** The loop's period: expiry, probes, run status and uploads are looked at this often. */
const TICK_MS = 100;
/**
 * PostgreSQL: how often each replica beats (its row's heartbeat, with its live view for the
 * others), reads the others' views, balances the endpoints and, on the coordinating replica, looks
 * for replicas that died.
 */
const VIEW_MS = 1000;
/** PostgreSQL: how often the coordinating replica looks for leases no live replica holds, whatever it saw leave. */
const ORPHAN_SWEEP_MS = 30_000;
/** PostgreSQL: how often runs left validating by a replica that died are looked for. */
const VALIDATION_SWEEP_MS = 10_000;
/**
 * PostgreSQL: samples are sent only while this replica's row was last confirmed this recently
 * (each heartbeat, every second, confirms it). A process that was stalled (stopped, swapping, cut
 * off from the database) wakes with answers to handle before its next heartbeat; until one
 * confirms its row is still there, it sends nothing, even from samples it had claimed before the
 * stall. The coordinating replica removes a replica, and gives its leases and endpoints to others,
 * only after 15 s without a heartbeat (REPLICA_STALE_MS): any stall that lost the row lasted 14 s
 * or more, past this fence, which slow heartbeats under load stay well within.
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
 *
 * On SQLite one process dispatches: it holds the runner lock. On PostgreSQL every replica
 * dispatches, each to the endpoints it drives (one replica per endpoint, balanced as replicas come
 * and go: src/db/replicas.ts), with its own claims; the holder of the runner lock also
 * coordinates: it returns the leases of replicas that died, validates runs left validating, and
 * does each run-level step (forecasts, dry-run ends, shard uploads, the manifest, finishing) once.
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
  private readonly history: HistoryRecorder;
  private readonly runRates = new Map<string, RateWindow>();
  private active: RunRow[] = [];
  private timer: NodeJS.Timeout | null = null;
  private heartbeat: NodeJS.Timeout | null = null;
  /** PostgreSQL: the replica's heartbeat, with its live view, the others' views and the balance. */
  private viewTimer: NodeJS.Timeout | null = null;
  /** PostgreSQL: every replica dispatches; the lock's holder also coordinates. */
  private readonly shared: boolean;
  /** Holds the runner lock, its recovery done: run-level steps are this process's (always, on SQLite). */
  private coordinating = false;
  /** PostgreSQL: the other replicas' last published views. */
  private others: RunnerSnapshot[] = [];
  /** PostgreSQL, coordinating: the replicas seen at the last heartbeat, to notice one that left. */
  private seenReplicas = new Set<string>();
  private orphansSweptAt = 0;
  /** Registered (PostgreSQL) or holding the lock (SQLite), and recovery done: samples may be sent. */
  private dispatching = false;
  private beating = false;
  private sweptAt = 0;
  private stopping = false;
  private stopped: Promise<void> | null = null;
  /** performance.now() when this replica's row was last confirmed there (PostgreSQL). */
  private confirmedAt = 0;
  private pumping = false;
  private woken = false;
  private ticking = false;
  private readonly refreshes = new Coalesced();
  private readonly balances = new Coalesced();

  /**
   * @param onDeposed PostgreSQL: called once dispatch has stopped because this replica was taken
   *   for dead or lost the lock (it was stalled past their staleness); the caller starts a fresh runner.
   */
  constructor(
    private readonly deps: RunnerDeps,
    private readonly onDeposed?: () => void,
  ) {
    const { db, logger, clock, config } = deps;
    this.shared = db.dialect === 'pg';
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
    this.quality = new QualityWatch(
      deps,
      this.pool,
      () => this.writer.flush(),
      () => this.others.flatMap((v) => (v.fleet ? [v.fleet] : [])),
    );
    this.forecasts = new Forecasts(deps, this.pool, () => this.othersFleet());
    this.history = new HistoryRecorder(
      deps,
      () => this.snapshot(),
      () => ({ ...this.othersFleet().caps, ...this.forecasts.share(deps.clock()).caps }),
    );
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
        this.forgetRun(runId);
        void this.guard('reading the active runs', () => this.refreshActive());
      },
    });
  }

  // ---- start and stop ----

  /**
   * SQLite: takes the runner lock, returns a dead owner's leases to the queue, resumes validation,
   * starts ticking. PostgreSQL: registers this replica and dispatches at once; it coordinates too
   * if the lock is free.
   */
  async start(): Promise<void> {
    try {
      await (this.shared ? this.startShared() : this.startAlone());
    } catch (err) {
      // Not half a runner: timers, the lock and the replica's row go, then the caller hears why.
      await this.stop(0).catch(() => {});
      throw err;
    }
  }

  private async startAlone(): Promise<void> {
    await this.lock.take();
    // Asked to stop while taking the lock: it goes back at once.
    if (this.stopping) return await this.lock.release();
    await this.takeCoordination();
    await this.pool.sync();
    await this.refreshActive();
    // Asked to stop while recovering: no loop may start after stop() cleared the timers.
    if (this.stopping) return;
    this.dispatching = true;
    this.timer = setInterval(() => void this.tick(), TICK_MS);
    void this.tick();
  }

  private async startShared(): Promise<void> {
    const t0 = performance.now();
    await registerReplica(this.deps.db, { owner: this.owner, pid: process.pid, hostname: hostname() });
    this.confirmedAt = t0;
    if (this.stopping) return await leaveReplica(this.deps.db, this.owner);
    await this.pool.sync();
    await this.tryCoordinating();
    await this.balanced();
    await this.refreshActive();
    if (this.stopping) return;
    this.dispatching = true;
    this.timer = setInterval(() => void this.tick(), TICK_MS);
    this.viewTimer = setInterval(() => void this.guard('replica heartbeat', () => this.replicaBeat()), VIEW_MS);
    void this.tick();
  }

  /** With the lock just taken: its heartbeat, then a dead owner's leases back to the queue and validations resumed. */
  private async takeCoordination(): Promise<void> {
    // Beating from the start: a long recovery must not let the lock go stale under it.
    this.heartbeat = setInterval(() => void this.guard('runner heartbeat', () => this.beat()), HEARTBEAT_MS);
    try {
      if (this.shared) await this.sweepReplicas(await readReplicas(this.deps.db));
      await recover(this.deps.db, this.deps.logger, this.deps.startIngest);
    } catch (err) {
      // Not half a coordinator: the lock goes back, and another replica (or this one, later) takes it.
      if (this.heartbeat) clearInterval(this.heartbeat);
      this.heartbeat = null;
      await this.lock.release().catch(() => {});
      throw err;
    }
    this.orphansSweptAt = this.deps.clock();
    this.coordinating = true;
  }

  /** PostgreSQL: takes the lock if its holder is gone, and with it coordination. */
  private async tryCoordinating(): Promise<void> {
    if (this.coordinating || this.stopping) return;
    try {
      await this.lock.take();
    } catch (err) {
      if (err instanceof RunnerLockedError) return;
      throw err;
    }
    if (this.stopping) return await this.lock.release();
    await this.takeCoordination();
    this.deps.logger.info({ owner: this.owner }, 'this replica coordinates: recovery, uploads and finishing runs');
  }

  /**
   * PostgreSQL, every second: the heartbeat with this replica's view (a replica whose row is gone
   * was taken for dead and stops), the others' views, the coordinator's look for replicas that
   * died, and the endpoints' balance.
   */
  private async replicaBeat(): Promise<void> {
    // One at a time: a slow database must not let two balances or takeovers run.
    if (this.beating) return;
    this.beating = true;
    try {
      const t0 = performance.now();
      if (!(await beatReplica(this.deps.db, this.owner, this.ownSnapshot(true))))
        return await this.deposed('this replica was taken for dead (its heartbeat went stale)');
      this.confirmedAt = t0;
      // Stopping, it goes on beating while its requests finish, however long the grace period:
      // its endpoints and leases stay its own until it leaves, so none is driven or sent twice.
      if (this.stopping) return;
      const replicas = await readReplicas(this.deps.db);
      this.others = replicas.rows.flatMap((r) => (r.owner !== this.owner && r.view ? [r.view] : []));
      if (this.coordinating) await this.sweepReplicas(replicas);
      else await this.tryCoordinating();
      await this.balanced();
    } finally {
      this.beating = false;
    }
  }

  /**
   * Coordinating: removes the replicas that died (a heartbeat REPLICA_STALE_MS old, or a pid gone
   * on this machine), which frees their endpoints, and returns to the queue the leases no live
   * replica holds: at once when a replica died or left, and every ORPHAN_SWEEP_MS whatever happened
   * (a claim of a replica that stopped, its commit landing after it left).
   */
  private async sweepReplicas({ rows, now }: { rows: ReplicaRow[]; now: number }): Promise<void> {
    const host = hostname();
    const dead = rows.filter((r) => r.owner !== this.owner && (now - r.heartbeatAt >= REPLICA_STALE_MS || (r.hostname === host && !pidAlive(r.pid))));
    const removed = await removeReplicas(this.deps.db, dead);
    for (const owner of removed) this.deps.logger.warn({ replica: owner }, 'a replica stopped beating: its endpoints and leases go to the others');
    const present = new Set(rows.map((r) => r.owner).filter((o) => !removed.includes(o)));
    const left = [...this.seenReplicas].some((o) => !present.has(o));
    this.seenReplicas = present;
    if (removed.length || left || this.deps.clock() - this.orphansSweptAt >= ORPHAN_SWEEP_MS) {
      this.orphansSweptAt = this.deps.clock();
      await releaseLeftLeases(this.deps.db, this.deps.logger);
    }
  }

  /**
   * PostgreSQL: takes this replica's share of the endpoints, and hands over what it holds past it,
   * each endpoint once its requests here have ended, so one never runs past its cap across replicas.
   */
  private balanced(): Promise<void> {
    return this.balances.run(() => this.balance());
  }

  private async balance(): Promise<void> {
    const share = await balanceEndpoints(this.deps.db, this.owner);
    if (!share) return await this.deposed('this replica was taken for dead (its heartbeat went stale)');
    const driven = new Set(share.driven);
    const mine = this.pool.driven().filter((e) => driven.has(e.row.id));
    // The ones already leaving first, then those with the least under way.
    mine.sort((x, y) => Number(y.handingOff) - Number(x.handingOff) || x.inFlight.size - y.inFlight.size);
    for (const [i, e] of mine.entries()) e.handingOff = i < share.surplus;
    for (const e of mine) {
      if (!e.handingOff || e.inFlight.size > 0) continue;
      await releaseDriver(this.deps.db, this.owner, e.row.id);
      driven.delete(e.row.id);
      this.deps.logger.info({ endpoint_id: e.row.id }, 'endpoint handed over to another replica');
    }
    this.pool.drive(driven);
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
    if (!(await this.lock.beat())) await this.deposed('the runner lock was taken by another process');
  }

  /**
   * Another process took the lock over, or (PostgreSQL) took this replica for dead: this one missed
   * its heartbeats (a stalled process, a cut network), and its leases were or will be returned to
   * the queue, so it stops at once; its commits are refused by their owner checks. The caller
   * starts a fresh runner (PostgreSQL), which joins as a new replica.
   */
  private async deposed(why: string): Promise<void> {
    if (this.stopping) return;
    this.deps.logger.error({ owner: this.owner }, `${why}; dispatch stops`);
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
    // Left behind, the lock goes stale within LOCK_STALE_MS, a replica's row within
    // REPLICA_STALE_MS: not worth failing a clean shutdown for.
    if (this.shared) await this.guard('leaving the replicas', () => leaveReplica(this.deps.db, this.owner));
    // Owner-checked: a lock taken while recovery was still under way goes back too, another's stays.
    await this.guard('releasing the runner lock', () => this.lock.release());
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
    if (!this.dispatching || this.stopping) return 'stopped';
    return this.shared && this.coordinating ? 'coordinating' : 'dispatching';
  }

  /** This process's own rates, endpoints and forecasts; `withFleet`, what the other replicas need of its endpoints too (PostgreSQL: what it publishes). */
  private ownSnapshot(withFleet = false): RunnerSnapshot {
    const now = this.deps.clock();
    const runs: RunnerSnapshot['runs'] = {};
    const inFlight = new Map<string, number>();
    for (const f of this.requests.all()) inFlight.set(f.run.id, (inFlight.get(f.run.id) ?? 0) + 1);
    for (const run of this.active) {
      const r = this.runRates.get(run.id)?.rates(now);
      const forecast = this.forecasts.get(run.id);
      const in_flight = inFlight.get(run.id) ?? 0;
      if (!r && !forecast && !in_flight) continue;
      runs[run.id] = r
        ? { samples_per_second: r.samples, completion_tokens_per_second: r.tokens, forecast, in_flight }
        : { ...IDLE_PROGRESS, forecast, in_flight };
    }
    const own: RunnerSnapshot = { runs, endpoints: this.pool.snapshot(now), role: this.role() };
    if (withFleet) own.fleet = { ...this.forecasts.share(now), ...this.quality.share() };
    return own;
  }

  /**
   * Every run's rates and every live endpoint's state at once, for the API thread to read from. On
   * PostgreSQL, the whole fleet's: the rates of all replicas summed, each endpoint as the replica
   * driving it sees it, the coordinator's forecasts.
   */
  snapshot(): RunnerSnapshot {
    const own = this.ownSnapshot();
    if (!this.shared) return own;
    for (const view of this.others) {
      for (const [runId, p] of Object.entries(view.runs)) {
        const mine = own.runs[runId];
        own.runs[runId] = mine
          ? {
              samples_per_second: mine.samples_per_second + p.samples_per_second,
              completion_tokens_per_second: mine.completion_tokens_per_second + p.completion_tokens_per_second,
              in_flight: (mine.in_flight ?? 0) + (p.in_flight ?? 0),
              forecast: mine.forecast ?? p.forecast,
            }
          : p;
      }
      for (const [id, e] of Object.entries(view.endpoints)) if (!(id in own.endpoints)) own.endpoints[id] = e;
    }
    return own;
  }

  /** PostgreSQL: whether some endpoint is driven by no replica, as far as the views tell: one just registered. */
  private driverless(): boolean {
    const elsewhere = new Set(this.others.flatMap((v) => Object.keys(v.endpoints)));
    for (const e of this.pool.live.values()) if (!e.driven && !elsewhere.has(e.row.id)) return true;
    return false;
  }

  /** PostgreSQL: the endpoints the other replicas drive, as they published them, for the forecast. */
  private othersFleet(): FleetShare {
    const fleet: FleetShare = { caps: {}, speeds: {} };
    for (const view of this.others) {
      Object.assign(fleet.caps, view.fleet?.caps);
      for (const [runId, speeds] of Object.entries(view.fleet?.speeds ?? {})) fleet.speeds[runId] = { ...fleet.speeds[runId], ...speeds };
    }
    return fleet;
  }

  wake(): void {
    if (this.woken || this.stopping || !this.dispatching) return;
    this.woken = true;
    queueMicrotask(() => {
      this.woken = false;
      void this.guard('runner wake', async () => {
        await this.pool.sync();
        // An endpoint just registered is driven, and probed, at once rather than at the next heartbeat.
        if (this.shared && this.driverless()) await this.balanced();
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
    if (this.shared) {
      // A heartbeat comes every 5 s; a replica that took the lock over meanwhile must not see this
      // one upload or finish for that long.
      if (this.coordinating && (await runnerLockOwner(this.deps.db)) !== this.owner) return await this.deposed('the runner lock was taken by another process');
      // Other replicas register and change endpoints without waking this one.
      await this.pool.sync();
      if (this.coordinating) await this.sweepValidations();
    }
    this.pool.probeDue();
    if (this.coordinating) await expireBatches(this.deps);
    await this.refreshActive();
    this.claims.newTick();
    this.pump();
    if (!this.coordinating) return;
    await this.forecasts.update(this.active);
    await this.endDryRuns();
    await this.finisher.advance(this.active);
    await this.history.tick();
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
      await dropCancelledSamples(this.deps.db, run.id);
      this.deps.logger.info({ run_id: run.id }, 'dry run: calibration slice answered');
    }
  }

  /** Reads the active runs again; reads never overlap (one asked for meanwhile follows). */
  private refreshActive(): Promise<void> {
    return this.refreshes.run(() => this.readActive());
  }

  private async readActive(): Promise<void> {
    const active = await listRunsByStatus(this.deps.db, ACTIVE_RUN_STATUSES);
    if (!this.coordinating) {
      // Runs finish on the coordinator: what the other replicas learned of one goes when it leaves.
      const ids = new Set(active.map((r) => r.id));
      for (const gone of this.active.filter((r) => !ids.has(r.id))) this.forgetRun(gone.id);
    }
    // Each run's quality checks are built before the run is dispatched, so every answer finds them.
    for (const r of active) if (isDispatchable(r.status)) await this.quality.load(r);
    this.active = active;
    // Claimed samples wait in a buffer only while some endpoint can take them; otherwise they
    // would sit `in_progress` for as long as the fleet is down.
    const dispatchable = new Set<string>();
    for (const r of this.active) {
      if (!isDispatchable(r.status)) continue;
      if (this.pool.servesNow(r.model)) dispatchable.add(r.id);
      // Whether any replica can serve it: the coordinator says so once for all.
      if (this.coordinating) await this.sayWhyWaiting(r, this.pool.servedAnywhere(r.model));
    }

    for (const runId of [...this.claims.runs()]) if (!dispatchable.has(runId)) this.claims.release(runId);
    for (const f of this.requests.all()) {
      const run = this.active.find((r) => r.id === f.run.id);
      if (!run || run.status === 'cancelling') this.requests.abort(f, 'cancel');
    }
  }

  /** A finished run's checks, forecast and rate would otherwise stay in memory for the life of the process. */
  private forgetRun(runId: string): void {
    this.quality.forget(runId);
    this.forecasts.forget(runId);
    this.runRates.delete(runId);
  }

  /** Fills every free slot now. Called after each outcome, on wake and on every tick. */
  private pump(): void {
    if (this.pumping || this.stopping || !this.dispatching) return;
    if (this.shared && performance.now() - this.confirmedAt > LOCK_FENCE_MS) return;
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
    if (r.closedShards.length && this.coordinating) await this.finisher.advance(this.active);
  }
}
