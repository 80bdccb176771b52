import type { RunnerDeps } from '../../deps.js';
import { releaseRunLeases } from '../../db/samples.js';
import type { FleetShare } from '../../domain/live-view.js';
import type { EndpointPool } from '../endpoints.js';
import type { RunnerLock } from '../lock.js';
import type { RunnerSnapshot } from '../../domain/live-view.js';
import type { Fleet, FleetHooks } from './fleet.js';
import { Lead } from './lead.js';

/**
 * SQLite: one process dispatches, holding the runner lock; it drives every endpoint and does every
 * run-level step. At start every lease left is a gone process's, and goes back to the queue.
 */
export class AloneFleet implements Fleet {
  private readonly lead: Lead;

  constructor(
    deps: RunnerDeps,
    lock: RunnerLock,
    private readonly pool: EndpointPool,
    private readonly hooks: FleetHooks,
  ) {
    this.lead = new Lead(lock, deps, hooks, releaseRunLeases);
  }

  async join(): Promise<void> {
    await this.lead.take();
    await this.pool.sync();
  }

  get leads(): boolean {
    return this.lead.held;
  }

  role(): 'dispatching' {
    return 'dispatching';
  }

  maySend(): boolean {
    return true;
  }

  async tick(): Promise<void> {}

  async woken(): Promise<void> {}

  merge(own: RunnerSnapshot): RunnerSnapshot {
    return own;
  }

  peersShare(): FleetShare {
    return { caps: {}, speeds: {} };
  }

  peerShares(): FleetShare[] {
    return [];
  }

  drain(): void {}

  async leave(): Promise<void> {
    // Left behind, the lock goes stale within REGEN_REPLICA_STALE_MS: not worth failing a clean shutdown for.
    await this.hooks.guard('releasing the runner lock', () => this.lead.drop());
  }
}
