// Batch expiry runs on the runner thread, once a second (run-steps.ts). It lives apart from batch
// creation so that the runner thread loads none of the API side: no input parsing, no route
// schemas, no OpenAPI.
import type { RunnerDeps } from '../deps.js';
import { dueBatchRuns } from '../db/batches.js';
import { transitionRun } from '../db/runs.js';
import type { RunStatus } from '../domain/statuses.js';

/**
 * Gives up the unanswered samples of batches whose completion window has passed: the run is
 * cancelled (in-flight requests aborted, pending samples never sent), its answers are kept, and
 * the batch reads `expired`. Runs already finalizing have nothing left to give up. Called at most
 * once a second, just before a tick reads the active runs again.
 */
export async function expireBatches(deps: RunnerDeps): Promise<void> {
  const now = deps.clock();
  const due = await dueBatchRuns(deps.db, now);
  for (const r of due) {
    const to: RunStatus = r.status === 'validating' ? 'cancelled' : 'cancelling';
    const reason = `the batch's ${r.completionWindow} completion window passed`;
    // Marked expired by the move itself: a batch still validating ends here, and its event must say `batch.expired`.
    const moved = await transitionRun(deps.db, r.id, [r.status as RunStatus], to, now, { statusReason: reason, expiredAt: now });
    if (moved) deps.logger.info({ run_id: r.id, batch_id: r.batchId, status: to }, 'batch expired');
  }
}
