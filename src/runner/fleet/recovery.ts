import { listRunsByStatus } from '../../db/runs.js';
import type { Db } from '../../db/client.js';
import type { Logger } from '../../logger.js';
import { ACTIVE_RUN_STATUSES, type RunStatus } from '../../domain/statuses.js';

/** A run failed while its requests were in flight (its uploads, its quality) may hold leases too. */
const LEASE_HOLDING_STATUSES: readonly RunStatus[] = [...ACTIVE_RUN_STATUSES, 'failed'];

/**
 * Gives back a run's leases held by processes that are gone; returns how many. Alone, every lease
 * left is a gone process's (`releaseRunLeases`); among replicas, the live replicas' stay theirs
 * (`releaseOrphanLeases`).
 */
export type LeaseRelease = (db: Db, runId: string) => Promise<number>;

/**
 * The leases of processes that are gone return to the queue, each with the attempt it was charged
 * refunded (a crash, like a shutdown, is not the sample's fault).
 */
export async function releaseLeftLeases(db: Db, logger: Logger, release: LeaseRelease): Promise<void> {
  for (const r of await listRunsByStatus(db, LEASE_HOLDING_STATUSES)) {
    const released = await release(db, r.id);
    if (released) logger.info({ run_id: r.id, released }, 'leases of a stopped process returned to the queue');
  }
}

/** Taking over: leases left by stopped processes go back, and runs still validating are validated again from the start. */
export async function recover(db: Db, logger: Logger, startIngest: (runId: string) => void, release: LeaseRelease): Promise<void> {
  for (const r of await listRunsByStatus(db, ['validating'])) startIngest(r.id);
  await releaseLeftLeases(db, logger, release);
}
