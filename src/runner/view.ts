import type { EndpointLive, RunnerRole, RunnerSnapshot, RunProgress } from '../domain/live-view.js';

export type { EndpointLive, RunnerRole, RunnerSnapshot, RunProgress } from '../domain/live-view.js';

export interface RunnerView {
  runProgress(runId: string): RunProgress;
  endpointLive(endpointId: string): EndpointLive;
  /** This process's runner's role; null in a process that runs none (`--no-runner`). */
  role(): RunnerRole | null;
  /** Tells the runner that runs or endpoints changed, so it acts now rather than on its next tick. */
  wake(): void;
}

export const IDLE_PROGRESS: RunProgress = { samples_per_second: 0, completion_tokens_per_second: 0, forecast: null };
export const IDLE_ENDPOINT: EndpointLive = {
  in_flight: 0,
  samples_per_second: 0,
  completion_tokens_per_second: 0,
  p50_latency_ms: null,
  adaptive_cap: null,
  server: { running: null, queued: null, token_usage: null, read_at: null },
};

/** A view that reads from the last snapshot; what a run or endpoint missing from it reports. */
export function snapshotView(get: () => RunnerSnapshot, wake: () => void): RunnerView {
  return {
    runProgress: (runId) => get().runs[runId] ?? IDLE_PROGRESS,
    endpointLive: (endpointId) => get().endpoints[endpointId] ?? IDLE_ENDPOINT,
    role: () => get().role ?? null,
    wake,
  };
}

export const idleRunner: RunnerView = snapshotView(
  () => ({ runs: {}, endpoints: {} }),
  () => {},
);
