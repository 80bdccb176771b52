import { SAMPLE_ERROR_CODES, type SampleError } from '../domain/sample-errors.js';

// What becomes of a failed attempt, and how long anything that failed waits before it is tried
// again. Requests, shard uploads, endpoint probes and webhook deliveries all back off through backoffMs.

export interface BackoffPolicy {
  /** The wait after the first failure; each further failure doubles it. */
  firstMs: number;
  maxMs: number;
  /** Spread the wait over [wait/2, wait] so that samples failed together do not return together. */
  jitter: boolean;
}

/** A sample's failed request: 0.5 s, 1 s, 2 s… up to 30 s, jittered. */
export const REQUEST_BACKOFF: BackoffPolicy = { firstMs: 500, maxMs: 30_000, jitter: true };
/**
 * A failed write to storage (a shard upload, a validation that met a full disk): the first wait
 * (REGEN_STORE_RETRY_MS, 2 s) doubling up to 30 times it (a minute); a store that is down gets few writes.
 */
export function storeBackoff(firstMs: number): BackoffPolicy {
  return { firstMs, maxMs: firstMs * 30, jitter: false };
}
/** A webhook event its receiver did not take: the first wait (REGEN_WEBHOOK_RETRY_MS, 5 s) doubling up to an hour, jittered. */
export function webhookBackoff(firstMs: number): BackoffPolicy {
  return { firstMs, maxMs: Math.max(firstMs, 3_600_000), jitter: true };
}
/** The longest an unhealthy endpoint waits between probes. */
export const MAX_PROBE_BACKOFF_MS = 60_000;

/** The probes of an endpoint that keeps failing: the probe interval (or twice the short first look), doubling. */
export function probeBackoff(probeIntervalMs: number): BackoffPolicy {
  return { firstMs: Math.max(probeIntervalMs, 2 * firstProbeDelayMs(probeIntervalMs)), maxMs: MAX_PROBE_BACKOFF_MS, jitter: false };
}

/** The first look at an endpoint that just joined or went down comes soon: a second, or the interval when shorter. */
export function firstProbeDelayMs(probeIntervalMs: number): number {
  return Math.min(1000, probeIntervalMs);
}

/** How long to wait after the `failures`-th failure in a row (1 for the first). */
export function backoffMs(failures: number, policy: BackoffPolicy, random: () => number = Math.random): number {
  const doubled = policy.firstMs * 2 ** Math.max(0, failures - 1);
  const wait = Math.min(policy.maxMs, doubled);
  return policy.jitter ? Math.round(wait / 2 + random() * (wait / 2)) : wait;
}

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
    return { kind: 'retry', delayMs: backoffMs(faults, REQUEST_BACKOFF, random), serverFault: true };
  }
  if (budget.attempts >= budget.maxAttempts) return { kind: 'failed' };
  return { kind: 'retry', delayMs: backoffMs(budget.attempts, REQUEST_BACKOFF, random), serverFault: false };
}
