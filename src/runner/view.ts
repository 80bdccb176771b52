/** What the API reads from the live runner: rates and in-flight counts are not in the database. */
export interface RunProgress {
  samples_per_second: number;
  completion_tokens_per_second: number;
}

export interface EndpointLive {
  in_flight: number;
  samples_per_second: number;
  completion_tokens_per_second: number;
  p50_latency_ms: number | null;
  server: { running: number | null; queued: number | null };
}

export interface RunnerView {
  runProgress(runId: string): RunProgress;
  endpointLive(endpointId: string): EndpointLive;
  /** Tells the runner that runs or endpoints changed, so it acts now rather than on its next tick. */
  wake(): void;
}

export const idleRunner: RunnerView = {
  runProgress: () => ({ samples_per_second: 0, completion_tokens_per_second: 0 }),
  endpointLive: () => ({
    in_flight: 0,
    samples_per_second: 0,
    completion_tokens_per_second: 0,
    p50_latency_ms: null,
    server: { running: null, queued: null },
  }),
  wake: () => {},
};
