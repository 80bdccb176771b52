// Where an endpoint's cap comes from (docs/design.md "Runner"): one rule for the runner, the endpoint
// object and /metrics.

export const CAP_SOURCES = ['user', 'adaptive', 'server', 'default'] as const;
export type CapSource = (typeof CAP_SOURCES)[number];

/** What a probe read of the server's capacity (`/server_info`). */
export interface ServerCapacity {
  /** The sum over DP ranks of effective_max_running_requests_per_dp, else the launch flag; null when unknown. */
  maxRunning: number | null;
  /** The KV pool in tokens (max_total_num_tokens); null when unknown. */
  kvTokens: number | null;
}

/**
 * The cap in use and where it comes from: the adaptive cap when the server's load is readable,
 * never above an operator's max_concurrency; else the operator's value, the server's running
 * limit, or the default.
 */
export function capInUse(maxConcurrency: number | null, server: ServerCapacity, adaptive: number | null, fallback: number): { cap: number; source: CapSource } {
  if (adaptive !== null) {
    if (maxConcurrency !== null && maxConcurrency <= adaptive) return { cap: maxConcurrency, source: 'user' };
    return { cap: adaptive, source: 'adaptive' };
  }
  if (maxConcurrency !== null) return { cap: maxConcurrency, source: 'user' };
  if (server.maxRunning !== null) return { cap: server.maxRunning, source: 'server' };
  return { cap: fallback, source: 'default' };
}

/** The cap in use of an endpoint row, given the adaptive cap the runner reports for it. */
export function endpointCap(
  e: { maxConcurrency: number | null; serverMaxRunning: number | null; kvTokens: number | null },
  live: { adaptive_cap: number | null },
  fallback: number,
): { cap: number; source: CapSource } {
  return capInUse(e.maxConcurrency, { maxRunning: e.serverMaxRunning, kvTokens: e.kvTokens }, live.adaptive_cap, fallback);
}
