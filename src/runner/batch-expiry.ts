import { eq } from 'drizzle-orm';
import type { RunnerDeps } from '../deps.js';
import type { Db } from '../db/client.js';
import { dueBatchRuns } from '../db/batches.js';
import { transitionRun } from '../db/runs.js';
import { runs } from '../db/schema.js';
import type { RunStatus } from '../domain/statuses.js';

/**
 * Gives up the unanswered samples of batches whose completion window passed: the run is cancelled
 * (its answers are kept) and the batch reads `expired`. Runs already finalizing have nothing left
 * to give up. Called every tick, just before the tick reads the active runs again.
 */
export function expireBatches(deps: RunnerDeps): void {
  const now = deps.clock();
  const due = dueBatchRuns(deps.db, now);
  for (const r of due) {
    const to: RunStatus = r.status === 'validating' ? 'cancelled' : 'cancelling';
    const moved = deps.db.transaction((tx) => {
      const reason = `the batch's ${r.completionWindow} completion window passed`;
      if (!transitionRun(tx as unknown as Db, r.id, [r.status as RunStatus], to, now, { statusReason: reason })) return false;
      tx.update(runs).set({ expiredAt: now }).where(eq(runs.id, r.id)).run();
      return true;
    });
    if (moved) deps.logger.info({ run_id: r.id, batch_id: r.batchId, status: to }, 'batch expired');
  }
}
