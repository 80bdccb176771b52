import type { RunnerDeps } from '../deps.js';
import { transitionRun } from '../db/runs.js';
import type { QualityConfig, RunRow } from '../db/schema.js';
import { FLAGS, type Flag } from './quality.js';

export type GateSettings = Exclude<QualityConfig['gate'], false>;

// Every verdict starts with this, so a pause by the gate can be told from a pause by a user.
const VERDICT_PREFIX = 'quality gate:';

export function flagCounts(r: RunRow): Record<Flag, number> {
  return {
    empty_content: r.flagEmptyContent,
    missing_reasoning: r.flagMissingReasoning,
    truncated: r.flagTruncated,
    repetitive: r.flagRepetitive,
    too_short: r.flagTooShort,
  };
}

/** The run's gate, or null when quality checks or the gate are off. */
export function gateSettings(r: RunRow): GateSettings | null {
  return r.quality?.gate || null;
}

/** Enough samples are done to judge, and the flagged share is above the limit. */
export function overLimit(r: RunRow, gate: GateSettings): boolean {
  return r.completed >= gate.min_samples && r.flagged / r.completed > gate.max_flag_rate;
}

/** The run is paused by the gate and waits for someone to look (resume, override, retry or cancel). */
export function gateTripped(r: RunRow): boolean {
  return r.status === 'paused' && (r.statusReason?.startsWith(VERDICT_PREFIX) ?? false);
}

// A flag on 3 of 1000 samples reads "<1%", not "0%": it is there, just rare.
function percent(part: number, whole: number): string {
  const p = (100 * part) / whole;
  return part > 0 && p < 1 ? '<1%' : `${Math.round(p)}%`;
}

/** "quality gate: empty_content 86%, missing_reasoning 86% of 214 samples (flagged 87%, limit 20%)" */
export function gateVerdict(r: RunRow, gate: GateSettings): string {
  const counts = flagCounts(r);
  const parts = FLAGS.filter((f) => counts[f] > 0)
    .sort((a, b) => counts[b] - counts[a])
    .map((f) => `${f} ${percent(counts[f], r.completed)}`);
  const limit = `${Math.round(1000 * gate.max_flag_rate) / 10}%`;
  return `${VERDICT_PREFIX} ${parts.join(', ')} of ${r.completed} samples (flagged ${percent(r.flagged, r.completed)}, limit ${limit})`;
}

/**
 * Pauses a run whose flagged share is over its limit once enough samples are done, so a broken
 * model or template is caught in the first few hundred samples, not after days. Returns true when
 * it paused the run.
 */
export function checkGate(deps: RunnerDeps, r: RunRow): boolean {
  const gate = gateSettings(r);
  if (!gate || r.gateOverridden || r.status !== 'in_progress' || !overLimit(r, gate)) return false;
  const reason = gateVerdict(r, gate);
  if (!transitionRun(deps.db, r.id, ['in_progress'], 'paused', deps.clock(), { statusReason: reason })) return false;
  deps.logger.warn({ run_id: r.id, status: 'paused', reason }, 'run status');
  return true;
}
