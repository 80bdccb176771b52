import type { Deps } from '../../deps.js';
import { outputExpiresAt } from '../../domain/expiry.js';
import { ApiError, notFound } from '../../errors.js';
import { requeueRunSamples } from '../../db/requeue.js';
import { getRun, transitionRun } from '../../db/runs.js';
import { resetUploadAttempts } from '../../db/shards.js';
import type { RunRow } from '../../db/schema.js';
import { CANCELLABLE_RUN_STATUSES, PAUSABLE_RUN_STATUSES, RETRYABLE_RUN_STATUSES, TERMINAL_RUN_STATUSES, type RunStatus } from '../../domain/statuses.js';

async function mustGet(deps: Deps, id: string): Promise<RunRow> {
  const run = await getRun(deps.db, id);
  if (!run) throw notFound('run', id);
  return run;
}

/**
 * Moves the run from one of `from` to `to` if it is still in one, and returns it as the move left
 * it (read in the same transaction, before the runner thread acts on it); null when it has moved on.
 */
async function moved(deps: Deps, run: RunRow, from: readonly RunStatus[], to: RunStatus, extra = {}): Promise<RunRow | null> {
  if (!from.includes(run.status as RunStatus)) return null;
  const after = await deps.db.tx(async (tx) => ((await transitionRun(tx, run.id, from, to, deps.clock(), extra)) ? getRun(tx, run.id) : null));
  if (!after) return null;
  deps.logger.info({ run_id: run.id, from: run.status, status: to }, 'run status');
  deps.runner.wake();
  return after;
}

async function move(deps: Deps, run: RunRow, from: readonly RunStatus[], to: RunStatus, verb: string, extra = {}): Promise<RunRow> {
  const after = await moved(deps, run, from, to, extra);
  if (after) return after;
  const now = (await getRun(deps.db, run.id))!;
  throw new ApiError('conflict', `cannot ${verb} a run that is ${now.status}`);
}

/** No new dispatch; requests already sent finish and are recorded. */
export async function pauseRun(deps: Deps, id: string): Promise<RunRow> {
  return move(deps, await mustGet(deps, id), PAUSABLE_RUN_STATUSES, 'paused', 'pause');
}

export async function resumeRun(deps: Deps, id: string, overrideGate: boolean): Promise<RunRow> {
  const run = await mustGet(deps, id);
  return move(deps, run, ['paused'], 'queued', 'resume', overrideGate ? { gateOverridden: true } : {});
}

/** In-flight requests are aborted by the runner, which then writes what completed and the manifest. */
export async function cancelRun(deps: Deps, id: string): Promise<RunRow> {
  const run = await mustGet(deps, id);
  if (run.status !== 'validating') return move(deps, run, CANCELLABLE_RUN_STATUSES, 'cancelling', 'cancel');
  // A run whose input is still being read ends at once (the ingest sees it and clears what it
  // inserted). Its input can be accepted between the read above and this move: the run is then
  // cancelled as a queued one is, not refused.
  const cancelled = await moved(deps, run, ['validating'], 'cancelled');
  if (cancelled) return cancelled;
  return move(deps, await mustGet(deps, id), CANCELLABLE_RUN_STATUSES, 'cancelling', 'cancel');
}

/**
 * Puts a run's failed (or flagged) samples back in the queue with a fresh attempt budget and
 * reopens their shards; the shard writer later rewrites each one whole.
 */
export async function retryRun(deps: Deps, id: string, only: 'failed' | 'flagged'): Promise<{ run: RunRow; requeued: number }> {
  const run = await mustGet(deps, id);
  if (!RETRYABLE_RUN_STATUSES.includes(run.status as RunStatus)) throw new ApiError('conflict', `cannot retry samples of a run that is ${run.status}`);
  if (run.total === 0) throw new ApiError('conflict', 'the run has no samples');
  // Its shards are deleted, or are being: a retry would write a manifest of shards that are gone.
  // Refused from the moment the lifetime ends, not from the sweep's mark, so the two never race.
  const { db } = deps;
  const now = deps.clock();
  const expiresAt = outputExpiresAt(run);
  if (run.outputExpiredAt !== null || (expiresAt !== null && expiresAt <= now)) {
    throw new ApiError('conflict', "the run's output expired and was deleted; start a new run");
  }
  const requeued = await requeueRunSamples(db, id, only, now);
  // A run failed because its shards could not be written keeps its answers, as does one cancelled
  // once all its samples had ended: a retry writes them.
  const unwritten = (run.status === 'failed' || (run.status === 'cancelled' && run.cancelled === 0)) && run.shardsUploaded < run.shardsTotal;
  if (unwritten) await resetUploadAttempts(db, id);
  if (requeued > 0 && run.manifestKey) {
    // The old manifest would describe shards that are about to be rewritten; a new one comes at the
    // end. Deleted before the run is queued again: a runner quick to finish it could otherwise write
    // the new one first, and this would delete it.
    await deps.stores
      .forOutput(run.outputUri, run.outputFolder)
      .delete(run.manifestKey)
      .catch((err: Error) => deps.logger.warn({ run_id: id, err: { message: err.message } }, 'stale manifest could not be deleted'));
  }
  // An ended run is queued again, and the answer read, as any move (`moved`): the runner claims
  // nothing of an ended run, so the answer shows the run before a requeued sample is claimed. (The
  // requeue and the reset stay transactions of their own: in one, the reset would lock shards after
  // the requeue locked the run's row, the reverse of an upload marking its shard.)
  const queued = requeued > 0 || unwritten ? await moved(deps, run, TERMINAL_RUN_STATUSES, 'queued', { finishedAt: null }) : null;
  const reopened = queued ?? (await getRun(db, id))!;
  deps.logger.info({ run_id: id, requeued, only }, 'samples requeued');
  deps.runner.wake();
  return { run: reopened, requeued };
}
