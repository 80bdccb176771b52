import { releaseRunLeases } from '../db/samples.js';
import { listRunsByStatus } from '../db/runs.js';
import type { Db } from '../db/client.js';
import type { Logger } from '../logger.js';
import { RECOVERABLE_RUN_STATUSES } from '../domain/statuses.js';

/**
 * On start, with the runner lock held: every lease left in the database belongs to a process that
 * is gone, so each returns to the queue with the attempt it was charged refunded (a crash, like a
 * shutdown, is not the sample's fault). Runs still validating are handed to `startIngest`, which
 * validates them again from the start.
 */
export async function recover(db: Db, logger: Logger, startIngest: (runId: string) => void): Promise<void> {
  for (const r of await listRunsByStatus(db, RECOVERABLE_RUN_STATUSES)) {
    if (r.status === 'validating') {
      startIngest(r.id);
      continue;
    }
    const released = await releaseRunLeases(db, r.id);
    if (released) logger.info({ run_id: r.id, released }, 'leases of a stopped process returned to the queue');
  }
}
