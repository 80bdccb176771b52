import type { Deps } from '../deps.js';
import { transitionRun } from '../db/runs.js';
import type { RunRow } from '../db/schema.js';
import { FLAGS } from './quality.js';

export function flagCounts(r: RunRow): Record<(typeof FLAGS)[number], number> {
  return {
    empty_content: r.flagEmptyContent,
    missing_reasoning: r.flagMissingReasoning,
    truncated: r.flagTruncated,
    repetitive: r.flagRepetitive,
    too_short: r.flagTooShort,
  };
}

/** "quality gate: empty_content 86%, missing_reasoning 86% of 214 samples" */
export function gateVerdict(r: RunRow): string {
  const counts = flagCounts(r);
  const parts = FLAGS.filter((f) => counts[f] > 0)
    .sort((a, b) => counts[b] - counts[a])
    .map((f) => `${f} ${Math.round((100 * counts[f]) / r.completed)}%`);
  return `quality gate: ${parts.join(', ')} of ${r.completed} samples (flagged ${Math.round((100 * r.flagged) / r.completed)}%, limit ${Math.round(100 * (r.quality && r.quality.gate ? r.quality.gate.max_flag_rate : 0))}%)`;
}

/**
 * Pauses a run whose flagged share is over its limit once enough samples are done, so a broken
 * model or template is caught in the first few hundred samples, not after days. Returns true when
 * it paused the run.
 */
export function checkGate(deps: Deps, r: RunRow): boolean {
  const gate = r.quality?.gate;
  if (!gate || r.gateOverridden || r.status !== 'in_progress') return false;
  if (r.completed < gate.min_samples || r.flagged / r.completed <= gate.max_flag_rate) return false;
  const reason = gateVerdict(r);
  if (!transitionRun(deps.db, r.id, ['in_progress'], 'paused', deps.clock(), { statusReason: reason })) return false;
  deps.logger.warn({ run_id: r.id, status: 'paused', reason }, 'run status');
  return true;
}
