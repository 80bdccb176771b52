// The lifecycle words of runs, samples, shards and endpoints (docs/design.md "Words and
// statuses"). One list each; every other set of statuses in the code is derived from these.

export const RUN_STATUSES = ['validating', 'queued', 'in_progress', 'paused', 'finalizing', 'completed', 'failed', 'cancelling', 'cancelled'] as const;
export type RunStatus = (typeof RUN_STATUSES)[number];

/**
 * Where a run may go from each status, and who moves it there:
 * - validating → queued | failed (ingest), cancelled (an operator, or an expired batch);
 * - queued → in_progress (the runner's first claim), paused (an operator), cancelling;
 * - in_progress → paused (an operator or the quality gate), finalizing (all samples terminal), cancelling;
 * - paused → queued (resume), cancelling;
 * - finalizing → completed (the manifest is written), cancelling;
 * - cancelling → cancelled (the manifest is written);
 * - completed | failed | cancelled → queued (a retry of failed or flagged samples).
 * in_progress and queued may also finish directly when the last shard closes in the same tick.
 */
export const RUN_TRANSITIONS: Readonly<Record<RunStatus, readonly RunStatus[]>> = {
  validating: ['queued', 'failed', 'cancelled'],
  // → failed from a running run: its shards could not be written (runner/finishing.ts).
  queued: ['in_progress', 'paused', 'cancelling', 'finalizing', 'failed'],
  in_progress: ['paused', 'finalizing', 'cancelling', 'completed', 'failed'],
  paused: ['queued', 'cancelling', 'failed'],
  finalizing: ['completed', 'cancelling', 'failed'],
  cancelling: ['cancelled'],
  completed: ['queued'],
  failed: ['queued'],
  cancelled: ['queued'],
};

export function canTransition(from: RunStatus, to: RunStatus): boolean {
  return RUN_TRANSITIONS[from].includes(to);
}

export const TERMINAL_RUN_STATUSES: readonly RunStatus[] = ['completed', 'failed', 'cancelled'];
/** Runs the runner looks after: it dispatches, drains, uploads or finishes them. */
export const ACTIVE_RUN_STATUSES: readonly RunStatus[] = ['queued', 'in_progress', 'paused', 'cancelling', 'finalizing'];
/** Runs whose pending samples may be sent now. */
export const DISPATCHABLE_RUN_STATUSES: readonly RunStatus[] = ['queued', 'in_progress'];
/** Runs an operator may pause; a run already finalizing has nothing left to send. */
export const PAUSABLE_RUN_STATUSES: readonly RunStatus[] = ['queued', 'in_progress'];
export const CANCELLABLE_RUN_STATUSES: readonly RunStatus[] = ['queued', 'in_progress', 'paused', 'finalizing'];
/** Runs whose failed or flagged samples may be put back in the queue. */
export const RETRYABLE_RUN_STATUSES: readonly RunStatus[] = ['completed', 'failed', 'cancelled', 'paused', 'in_progress', 'queued'];

export const isTerminalRun = (s: string): boolean => TERMINAL_RUN_STATUSES.includes(s as RunStatus);
export const isDispatchable = (s: string): boolean => DISPATCHABLE_RUN_STATUSES.includes(s as RunStatus);

export const SAMPLE_STATUSES = ['pending', 'in_progress', 'completed', 'failed', 'cancelled'] as const;
export type SampleStatus = (typeof SAMPLE_STATUSES)[number];

export const SHARD_STATUSES = ['open', 'uploaded'] as const;
export type ShardStatus = (typeof SHARD_STATUSES)[number];

export const ENDPOINT_STATES = ['starting', 'ready', 'unhealthy', 'draining', 'disabled', 'quarantined'] as const;
export type EndpointState = (typeof ENDPOINT_STATES)[number];
/** States an operator may set with PATCH; the others are the probes' verdicts. */
export const OPERATOR_ENDPOINT_STATES = ['ready', 'draining', 'disabled'] as const satisfies readonly EndpointState[];
/**
 * States in which the probes leave an endpoint alone: an operator parked it, or the quality gate
 * took it out for its answers (an operator puts it back with PATCH state=ready).
 */
export const PARKED_ENDPOINT_STATES: readonly EndpointState[] = ['draining', 'disabled', 'quarantined'];
