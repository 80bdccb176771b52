import type { FleetShare } from '../../domain/live-view.js';
import type { RunnerRole, RunnerSnapshot } from '../../domain/live-view.js';

/** What the fleet asks of the runner it serves. */
export interface FleetHooks {
  /** This process's own live view, with what the other replicas need of its endpoints: what a replica publishes. */
  publish(): RunnerSnapshot;
  /**
   * Dispatch must stop: another process took the lock over, or this replica was taken for dead
   * (it was stalled past their staleness). The runner stops without waiting on the caller.
   */
  deposed(why: string): void;
  /** Runs a step whose failure is logged and left to the next turn (the runner's guard): never rejects. */
  guard(what: string, step: () => Promise<void>): Promise<void>;
}

/**
 * How this process takes part in dispatch, chosen once at start from the store (index.ts): alone
 * (SQLite: alone.ts), holding the runner lock, or as one replica of several (PostgreSQL:
 * replica.ts), each dispatching to the endpoints it drives while the lock's holder also does the
 * run-level steps. The runner's loop asks only what is below, never which store it runs on.
 */
export interface Fleet {
  /**
   * Takes this process's part: the lock, or a replica's row and its share of the endpoints, with
   * recovery when it leads; the endpoint table is read. Throws RunnerLockedError when another live
   * process dispatches alone on the database.
   */
  join(): Promise<void>;
  /**
   * This process does the run-level steps now (batch expiry, forecasts, dry-run ends, uploads,
   * finishing, why a run waits): it holds the runner lock, its recovery done.
   */
  readonly leads: boolean;
  /** The role the API reports while this process dispatches. */
  role(): Exclude<RunnerRole, 'stopped'>;
  /** Whether samples may be sent now: a replica sends nothing while its row is not confirmed recently. */
  maySend(): boolean;
  /** Each turn of the loop, before its own work: what others changed is taken in, the lock's hold checked. */
  tick(): Promise<void>;
  /** The runner was woken (an endpoint or run changed): an endpoint no one drives is taken at once. */
  woken(): Promise<void>;
  /** The fleet's live view: this process's own, with the other replicas' merged in. */
  merge(own: RunnerSnapshot): RunnerSnapshot;
  /** The endpoints the other replicas drive, as they published them, for the forecast. */
  peersShare(): FleetShare;
  /** Each other replica's published share, for the quality gate. */
  peerShares(): FleetShare[];
  /**
   * Dispatch is stopping: nothing more is taken on (no takeover, no new endpoint), while beats go
   * on so that what this process holds stays its own until it leaves.
   */
  drain(): void;
  /** Leaves: beats stop, the replica's row and the lock go back (a failure is logged: they go stale). */
  leave(): Promise<void>;
}
