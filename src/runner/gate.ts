import type { RunnerDeps } from '../deps.js';
import { transitionRun } from '../db/runs.js';
import type { RunRow } from '../db/schema.js';
import { gateSettings, gateTrips, gateVerdict } from '../domain/quality.js';

/**
 * Pauses a run whose flagged share is over its limit once enough samples are done, so a broken
 * model or template is caught in the first few hundred samples, not after days. Returns true when
 * it paused the run.
 */
export async function checkGate(deps: RunnerDeps, r: RunRow): Promise<boolean> {
  if (!gateTrips(r)) return false;
  return pauseForGate(deps, r.id, gateVerdict(r, gateSettings(r)!));
}

/** The gate's pause, whichever check tripped it: only a run still in progress, so an operator's move wins. Returns true when it paused the run. */
export async function pauseForGate(deps: RunnerDeps, runId: string, reason: string): Promise<boolean> {
  if (!(await transitionRun(deps.db, runId, ['in_progress'], 'paused', deps.clock(), { statusReason: reason }))) return false;
  deps.logger.warn({ run_id: runId, status: 'paused', reason }, 'run status');
  return true;
}
