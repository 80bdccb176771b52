import type { RunnerDeps } from '../../deps.js';
import type { RunnerLock } from '../lock.js';
import type { FleetHooks } from './fleet.js';
import { recover, type LeaseRelease } from './recovery.js';

/**
 * The runner lock held, with its heartbeat and the recovery that follows its taking: the process
 * holding it does the run-level steps. Alone, it is the right to dispatch at all; among replicas,
 * the coordinator's, taken over by another replica when its holder dies.
 */
export class Lead {
  private heartbeat: NodeJS.Timeout | null = null;
  /** The lock is held and recovery done: run-level steps are this process's. */
  held = false;

  constructor(
    private readonly lock: RunnerLock,
    private readonly deps: RunnerDeps,
    private readonly hooks: FleetHooks,
    private readonly release: LeaseRelease,
  ) {}

  /**
   * Takes the lock (RunnerLockedError while another live process holds it), then recovers:
   * `before` (a replica's look for the dead), a dead owner's leases back to the queue,
   * validations resumed. A failure leaves the lock free, for another process or a later try.
   */
  async take(before: () => Promise<void> = async () => {}): Promise<void> {
    await this.lock.take();
    // Beating from the start: a long recovery must not let the lock go stale under it.
    this.heartbeat = setInterval(() => void this.hooks.guard('runner heartbeat', () => this.beat()), this.lock.beatMs);
    try {
      await before();
      await recover(this.deps.db, this.deps.logger, this.deps.startIngest, this.release);
    } catch (err) {
      await this.drop().catch(() => {});
      throw err;
    }
    this.held = true;
  }

  private async beat(): Promise<void> {
    if (!(await this.lock.beat())) this.hooks.deposed('the runner lock was taken by another process');
  }

  /** Stops beating and gives the lock back; owner-checked, so one taken over by another stays theirs. */
  async drop(): Promise<void> {
    if (this.heartbeat) clearInterval(this.heartbeat);
    this.heartbeat = null;
    this.held = false;
    await this.lock.release();
  }
}
