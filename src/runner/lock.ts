import { hostname } from 'node:os';
import type { Db } from '../db/client.js';
import { beatRunnerLock, releaseRunnerLock, takeRunnerLock } from '../db/runner-lock.js';

/**
 * Another live regen process holds the runner lock of this database: two dispatchers would send
 * samples twice. The API thread recognises it by name without loading the runner.
 */
export class RunnerLockedError extends Error {}

/**
 * How long a transaction may stay open between statements before the server ends it: its process
 * is stalled (stopped, swapping, cut off). Two thirds of the staleness (REGEN_REPLICA_STALE_MS), so
 * that a stalled dispatcher's claim, which holds the lock row shared, is gone by the time a
 * standby may take the lock over.
 */
export const idleInTransactionMs = (staleMs: number): number => Math.round((staleMs * 2) / 3);

export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * The single-dispatcher lock of a database: one row naming the process that dispatches, so that a
 * restart can tell a dead owner's leases from a live one's. On PostgreSQL the other replicas stand
 * by and take the lock over once its holder's heartbeat is `staleMs` old (REGEN_REPLICA_STALE_MS).
 */
export class RunnerLock {
  private readonly host = hostname();
  /** How often the holder renews its heartbeat: a third of the staleness, so two missed beats are survived. */
  readonly beatMs: number;

  constructor(
    private readonly db: Db,
    readonly owner: string,
    private readonly clock: () => number,
    private readonly staleMs: number,
  ) {
    this.beatMs = Math.round(staleMs / 3);
  }

  /**
   * Takes the lock, or throws RunnerLockedError while another live process holds it. Heartbeats are
   * written and judged in the database's own time on PostgreSQL, so replicas on machines whose
   * clocks disagree judge one heartbeat alike; in this process's on SQLite.
   */
  async take(): Promise<void> {
    const held = await takeRunnerLock(this.db, { owner: this.owner, pid: process.pid, hostname: this.host }, this.clock, (h, now) => {
      const sameProcess = h.hostname === this.host && h.pid === process.pid;
      // Another host's pid cannot be checked: only its heartbeat tells.
      const alive = h.hostname !== this.host || pidAlive(h.pid);
      return h.owner !== this.owner && !sameProcess && alive && now - h.heartbeatAt < this.staleMs;
    });
    if (held) throw new RunnerLockedError(`another regen process (pid ${held.pid} on ${held.hostname}) is running dispatch on this database`);
  }

  /** Renews the heartbeat; false when another process took the database over. */
  async beat(): Promise<boolean> {
    return beatRunnerLock(this.db, this.owner, this.clock);
  }

  async release(): Promise<void> {
    await releaseRunnerLock(this.db, this.owner);
  }
}
