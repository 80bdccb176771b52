import type { StoredForecast } from '../domain/forecast.js';

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

export interface RunnerView {
  runProgress(runId: string): RunProgress;
  endpointLive(endpointId: string): EndpointLive;
  /** Tells the runner that runs or endpoints changed, so it acts now rather than on its next tick. */
  wake(): void;
}

/** The whole view at one moment: what the runner's worker thread sends to the API thread. */
export interface RunnerSnapshot {
  runs: Record<string, RunProgress>;
  endpoints: Record<string, EndpointLive>;
}

export const IDLE_PROGRESS: RunProgress = { samples_per_second: 0, completion_tokens_per_second: 0, forecast: null };
export const IDLE_ENDPOINT: EndpointLive = {
  in_flight: 0,
  samples_per_second: 0,
  completion_tokens_per_second: 0,
  p50_latency_ms: null,
  adaptive_cap: null,
  server: { running: null, queued: null, token_usage: null },
};

/** A view that reads from the last snapshot; what a run or endpoint missing from it reports. */
export function snapshotView(get: () => RunnerSnapshot, wake: () => void): RunnerView {
  return {
    runProgress: (runId) => get().runs[runId] ?? IDLE_PROGRESS,
    endpointLive: (endpointId) => get().endpoints[endpointId] ?? IDLE_ENDPOINT,
    wake,
  };
}

export const idleRunner: RunnerView = snapshotView(
  () => ({ runs: {}, endpoints: {} }),
  () => {},
);
