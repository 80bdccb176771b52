import { backoffMs, requestBackoff } from '../domain/backoff.js';
import { SAMPLE_ERROR_CODES, type SampleError } from '../domain/sample-errors.js';

/**
 * A failed attempt's fate: failed for good, or back in the queue after a wait. A retry after the
 * server's fault refunds the attempt it was charged and counts a server fault instead.
 */
export type FailureDecision = { kind: 'failed' } | { kind: 'retry'; delayMs: number; serverFault: boolean };

/** What the policy reads of a sample and its run. */
export interface FailureBudget {
  /** Attempts charged so far, this one included. */
  attempts: number;
  maxAttempts: number;
  /** The server's faults so far, this one not included. */
  serverFaults: number;
  maxServerFaults: number;
  /** The wait after the first failure (REGEN_REQUEST_RETRY_MS); each further one doubles it. */
  retryMs: number;
}

/**
 * An error that is the request's own (a 400) fails the sample at once. A server's fault
 * (connection, timeout, 5xx, abort) is tried again, on whichever endpoint is free, until the
 * sample has met `maxServerFaults` of them; the sample's own faults use up `maxAttempts`.
 */
export function decideFailure(error: SampleError, budget: FailureBudget, random: () => number = Math.random): FailureDecision {
  const { retryable, fault } = SAMPLE_ERROR_CODES[error.code];
  if (!retryable) return { kind: 'failed' };
  if (fault === 'server') {
    const faults = budget.serverFaults + 1;
    if (faults >= budget.maxServerFaults) return { kind: 'failed' };
    return { kind: 'retry', delayMs: backoffMs(faults, requestBackoff(budget.retryMs), random), serverFault: true };
  }
  if (budget.attempts >= budget.maxAttempts) return { kind: 'failed' };
  return { kind: 'retry', delayMs: backoffMs(budget.attempts, requestBackoff(budget.retryMs), random), serverFault: false };
}
