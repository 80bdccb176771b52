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
  const reason = gateVerdict(r, gateSettings(r)!);
  if (!(await transitionRun(deps.db, r.id, ['in_progress'], 'paused', deps.clock(), { statusReason: reason }))) return false;
  deps.logger.warn({ run_id: r.id, status: 'paused', reason }, 'run status');
  return true;
}
