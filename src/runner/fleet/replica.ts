import { hostname } from 'node:os';
import type { RunnerDeps } from '../../deps.js';
import {
  balanceEndpoints,
  beatReplica,
  leaveReplica,
  readReplicas,
  registerReplica,
  releaseDriver,
  removeReplicas,
  type ReplicaRow,
} from '../../db/replicas.js';
import { runnerLockOwner } from '../../db/runner-lock.js';
import { validatingRunIds } from '../../db/runs.js';
import { releaseOrphanLeases } from '../../db/samples.js';
import type { FleetShare } from '../../domain/live-view.js';
import { Coalesced } from '../coalesced.js';
import type { EndpointPool } from '../endpoints.js';
import { pidAlive, RunnerLockedError, type RunnerLock } from '../lock.js';
import type { RunnerSnapshot } from '../../domain/live-view.js';
import type { Fleet, FleetHooks } from './fleet.js';
import { Lead } from './lead.js';
import { releaseLeftLeases } from './recovery.js';
import { PeerViews } from './views.js';

/**
 * How often each replica beats (its row's heartbeat, with its live view for the others), reads the
 * others' views, balances the endpoints and, on the coordinating replica, looks for replicas that died.
 */
const VIEW_MS = 1000;
/** How often the coordinating replica looks for leases no live replica holds, whatever it saw leave. */
const ORPHAN_SWEEP_MS = 30_000;
/** How often runs left validating by a replica that died are looked for. */
const VALIDATION_SWEEP_MS = 10_000;
/**
 * Samples are sent only while this replica's row was last confirmed within a third of the
 * staleness (5 s of the default 15 s); each heartbeat, every second, confirms it. A process that
 * was stalled (stopped, swapping, cut off from the database) wakes with answers to handle before
 * its next heartbeat; until one confirms its row is still there, it sends nothing, even from
 * samples it had claimed before the stall. The coordinating replica removes a replica, and gives
 * its leases and endpoints to others, only after REGEN_REPLICA_STALE_MS without a heartbeat: any
 * stall that lost the row lasted that less a beat or more, past this fence, which slow heartbeats
 * under load stay well within.
 */
const fenceMs = (staleMs: number): number => Math.round(staleMs / 3);

/**
 * The replica's part in the fleet. Moves, in order: `joining` (registered, endpoints read, the lock
 * tried, a share taken) → `joined` (beating, balancing, taking the lock over when its holder dies)
 * → `draining` (stopping: beating only, so its endpoints and leases stay its own until it leaves)
 * → `left`.
 */
type Phase = 'joining' | 'joined' | 'draining' | 'left';

/**
 * PostgreSQL: one replica of several, each dispatching to the endpoints it drives (one replica per
 * endpoint, balanced as replicas come and go: src/db/replicas.ts), with its own claims. The holder
 * of the runner lock also coordinates: it returns the leases of replicas that died, validates runs
 * left validating, and does each run-level step once.
 */
export class ReplicaFleet implements Fleet {
  private phase: Phase = 'joining';
  private readonly lead: Lead;
  private readonly peers: PeerViews;
  private viewTimer: NodeJS.Timeout | null = null;
  /** A beat is under way: the next one due meanwhile is skipped, so two balances or takeovers never run at once. */
  private beating = false;
  /** performance.now() when this replica's row was last confirmed there. */
  private confirmedAt = 0;
  /** Coordinating: the replicas seen at the last heartbeat, to notice one that left. */
  private seenReplicas = new Set<string>();
  private orphansSweptAt = 0;
  private validationsSweptAt = 0;
  private readonly balances = new Coalesced();

  constructor(
    private readonly deps: RunnerDeps,
    private readonly owner: string,
    lock: RunnerLock,
    private readonly pool: EndpointPool,
    private readonly hooks: FleetHooks,
  ) {
    this.lead = new Lead(lock, deps, hooks, releaseOrphanLeases);
    this.peers = new PeerViews(owner);
    // Nothing is driven until the first balance gives this replica its share.
    pool.drive(new Set());
  }

  /** Registers and dispatches at once; coordinates too if the lock is free. */
  async join(): Promise<void> {
    const t0 = performance.now();
    await registerReplica(this.deps.db, { owner: this.owner, pid: process.pid, hostname: hostname() });
    this.confirmedAt = t0;
    await this.pool.sync();
    await this.tryLeading();
    await this.balanced();
    this.phase = 'joined';
    this.viewTimer = setInterval(() => void this.hooks.guard('replica heartbeat', () => this.beat()), VIEW_MS);
  }

  get leads(): boolean {
    return this.lead.held;
  }

  role(): 'coordinating' | 'dispatching' {
    return this.lead.held ? 'coordinating' : 'dispatching';
  }

  maySend(): boolean {
    return performance.now() - this.confirmedAt <= fenceMs(this.deps.config.replicaStaleMs);
  }

  async tick(): Promise<void> {
    // A lock heartbeat comes every 5 s; a replica that took the lock over meanwhile must not see
    // this one upload or finish for that long.
    if (this.lead.held && (await runnerLockOwner(this.deps.db)) !== this.owner) return this.hooks.deposed('the runner lock was taken by another process');
    // Other replicas register and change endpoints without waking this one.
    await this.pool.sync();
    if (this.lead.held) await this.sweepValidations();
  }

  async woken(): Promise<void> {
    // An endpoint just registered is driven, and probed, at once rather than at the next heartbeat.
    if (this.driverless()) await this.balanced();
  }

  merge(own: RunnerSnapshot): RunnerSnapshot {
    return this.peers.merge(own);
  }

  peersShare(): FleetShare {
    return this.peers.share();
  }

  peerShares(): FleetShare[] {
    return this.peers.shares();
  }

  drain(): void {
    if (this.phase === 'joined') this.phase = 'draining';
  }

  async leave(): Promise<void> {
    this.phase = 'left';
    if (this.viewTimer) clearInterval(this.viewTimer);
    // Left behind, a replica's row and the lock go stale within REGEN_REPLICA_STALE_MS: not worth
    // failing a clean shutdown for.
    await this.hooks.guard('leaving the replicas', () => leaveReplica(this.deps.db, this.owner));
    await this.hooks.guard('releasing the runner lock', () => this.lead.drop());
  }

  /** Stopping or gone: nothing more is taken on. */
  private leaving(): boolean {
    return this.phase === 'draining' || this.phase === 'left';
  }

  /** Takes the lock if its holder is gone, and with it coordination. */
  private async tryLeading(): Promise<void> {
    if (this.lead.held || this.leaving()) return;
    try {
      await this.lead.take(async () => this.sweepReplicas(await readReplicas(this.deps.db)));
    } catch (err) {
      if (err instanceof RunnerLockedError) return;
      throw err;
    }
    this.orphansSweptAt = this.deps.clock();
    // Stopped while taking it: it goes back at once.
    if (this.leaving()) return await this.lead.drop();
    this.deps.logger.info({ owner: this.owner }, 'this replica coordinates: recovery, uploads and finishing runs');
  }

  /**
   * Every second: the heartbeat with this replica's view (a replica whose row is gone was taken
   * for dead and stops), the others' views, the coordinator's look for replicas that died, and the
   * endpoints' balance.
   */
  private async beat(): Promise<void> {
    if (this.beating) return;
    this.beating = true;
    try {
      const t0 = performance.now();
      if (!(await beatReplica(this.deps.db, this.owner, this.hooks.publish())))
        return this.hooks.deposed('this replica was taken for dead (its heartbeat went stale)');
      this.confirmedAt = t0;
      // Draining, it goes on beating while its requests finish, however long the grace period:
      // its endpoints and leases stay its own until it leaves, so none is driven or sent twice.
      if (this.phase !== 'joined') return;
      const replicas = await readReplicas(this.deps.db);
      this.peers.read(replicas.rows);
      if (this.lead.held) await this.sweepReplicas(replicas);
      else await this.tryLeading();
      await this.balanced();
    } finally {
      this.beating = false;
    }
  }

  /**
   * Coordinating: removes the replicas that died (a heartbeat REGEN_REPLICA_STALE_MS old, or a pid gone
   * on this machine), which frees their endpoints, and returns to the queue the leases no live
   * replica holds: at once when a replica died or left, and every ORPHAN_SWEEP_MS whatever happened
   * (a claim of a replica that stopped, its commit landing after it left).
   */
  private async sweepReplicas({ rows, now }: { rows: ReplicaRow[]; now: number }): Promise<void> {
    const host = hostname();
    const dead = rows.filter(
      (r) => r.owner !== this.owner && (now - r.heartbeatAt >= this.deps.config.replicaStaleMs || (r.hostname === host && !pidAlive(r.pid))),
    );
    const removed = await removeReplicas(this.deps.db, dead);
    for (const owner of removed) this.deps.logger.warn({ replica: owner }, 'a replica stopped beating: its endpoints and leases go to the others');
    const present = new Set(rows.map((r) => r.owner).filter((o) => !removed.includes(o)));
    const left = [...this.seenReplicas].some((o) => !present.has(o));
    this.seenReplicas = present;
    if (removed.length || left || this.deps.clock() - this.orphansSweptAt >= ORPHAN_SWEEP_MS) {
      this.orphansSweptAt = this.deps.clock();
      await releaseLeftLeases(this.deps.db, this.deps.logger, releaseOrphanLeases);
    }
  }

  /**
   * Coordinating: a run left `validating` by a replica that died is validated again here. Asking
   * for a run another replica still validates costs one refused hold (services/runs/ingest.ts).
   */
  private async sweepValidations(): Promise<void> {
    const now = this.deps.clock();
    if (now - this.validationsSweptAt < VALIDATION_SWEEP_MS) return;
    this.validationsSweptAt = now;
    for (const id of await validatingRunIds(this.deps.db)) this.deps.startIngest(id);
  }

  /** Whether some endpoint is driven by no replica, as far as the views tell: one just registered. */
  private driverless(): boolean {
    const elsewhere = this.peers.drivenElsewhere();
    for (const e of this.pool.live.values()) if (!e.driven && !elsewhere.has(e.row.id)) return true;
    return false;
  }

  /**
   * Takes this replica's share of the endpoints, and hands over what it holds past it, each
   * endpoint once its requests here have ended, so one never runs past its cap across replicas.
   */
  private balanced(): Promise<void> {
    return this.balances.run(() => this.balance());
  }

  private async balance(): Promise<void> {
    const share = await balanceEndpoints(this.deps.db, this.owner);
    if (!share) return this.hooks.deposed('this replica was taken for dead (its heartbeat went stale)');
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
}
