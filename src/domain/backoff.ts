// How long anything that failed waits before it is tried again: requests, shard uploads
// and webhook deliveries all back off through backoffMs.

export interface BackoffPolicy {
  /** The wait after the first failure; each further failure doubles it. */
  firstMs: number;
  maxMs: number;
  /** Spread the wait over [wait/2, wait] so that samples failed together do not return together. */
  jitter: boolean;
}

/** A sample's failed request: the first wait (REGEN_REQUEST_RETRY_MS, 0.5 s) doubling up to 60 times it (30 s), jittered. */
export function requestBackoff(firstMs: number): BackoffPolicy {
  return { firstMs, maxMs: firstMs * 60, jitter: true };
}
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
/** How long to wait after the `failures`-th failure in a row (1 for the first). */
export function backoffMs(failures: number, policy: BackoffPolicy, random: () => number = Math.random): number {
  const doubled = policy.firstMs * 2 ** Math.max(0, failures - 1);
  const wait = Math.min(policy.maxMs, doubled);
  return policy.jitter ? Math.round(wait / 2 + random() * (wait / 2)) : wait;
}
