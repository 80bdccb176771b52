import type { StoredForecast } from './forecast.js';

/** What the API reads from the live runner: rates and in-flight counts are not in the database. */
export interface RunProgress {
  samples_per_second: number;
  completion_tokens_per_second: number;
  /** The latest forecast, fresher than the one the run's row keeps; null when the runner has none. */
  forecast: StoredForecast | null;
}

export interface EndpointLive {
  in_flight: number;
  samples_per_second: number;
  completion_tokens_per_second: number;
  p50_latency_ms: number | null;
  /** The cap steered from the server's live load; null while no fresh reading backs it. */
  adaptive_cap: number | null;
  server: { running: number | null; queued: number | null; token_usage: number | null };
}

/**
 * What this process's runner does: it dispatches, or it stands by while another replica dispatches
 * (PostgreSQL), or it has stopped (shutting down, or deposed and not yet standing by again).
 */
export type RunnerRole = 'dispatching' | 'standby' | 'stopped';

/** The whole view at one moment: what the runner's worker thread sends to the API thread. */
export interface RunnerSnapshot {
  runs: Record<string, RunProgress>;
  endpoints: Record<string, EndpointLive>;
  /** The sending runner's own role; absent from older snapshots and the idle view. */
  role?: RunnerRole;
}
