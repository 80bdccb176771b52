import { releaseOrphanLeases, releaseRunLeases } from '../db/samples.js';
import { listRunsByStatus } from '../db/runs.js';
import type { Db } from '../db/client.js';
import type { Logger } from '../logger.js';
import { ACTIVE_RUN_STATUSES } from '../domain/statuses.js';

/**
 * The leases of processes that are gone return to the queue, each with the attempt it was charged
 * refunded (a crash, like a shutdown, is not the sample's fault). On SQLite, run at start with the
 * runner lock held, every lease left belongs to a process that is gone; on PostgreSQL, run by the
 * coordinating replica, the live replicas' leases stay theirs.
 */
export async function releaseLeftLeases(db: Db, logger: Logger): Promise<void> {
  for (const r of await listRunsByStatus(db, ACTIVE_RUN_STATUSES)) {
    const released = db.dialect === 'pg' ? await releaseOrphanLeases(db, r.id) : await releaseRunLeases(db, r.id);
    if (released) logger.info({ run_id: r.id, released }, 'leases of a stopped process returned to the queue');
  }
}

/** Taking over: leases left by stopped processes go back, and runs still validating are validated again from the start. */
export async function recover(db: Db, logger: Logger, startIngest: (runId: string) => void): Promise<void> {
  for (const r of await listRunsByStatus(db, ['validating'])) startIngest(r.id);
  await releaseLeftLeases(db, logger);
}
