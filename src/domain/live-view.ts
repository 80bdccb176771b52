import type { StoredForecast } from './forecast.js';

/** What the API reads from the live runner: rates and in-flight counts are not in the database. */
export interface RunProgress {
  samples_per_second: number;
  completion_tokens_per_second: number;
  /** A conversation run's turns answered a second; absent for other runs and from older replicas' views. */
  turns_per_second?: number;
  /** Requests sent and not yet answered (not the samples claimed ahead); absent from older replicas' views. */
  in_flight?: number;
  /** The samples those requests answer: with params.n > 1 a request answers up to n of a line's samples. */
  samples_in_flight?: number;
  /** Requests of the run endpoints turned away for a while (429, a gateway's shedding), since this process took it up; absent when none. */
  turned_away?: number;
  /** The latest forecast, fresher than the one the run's row keeps; null when the runner has none. */
  forecast: StoredForecast | null;
  /** A run with output.tokens: the endpoints serving its model that it is not sent to, as they return no token ids; absent when none. */
  without_ids?: EndpointWithoutIds[];
}

export interface EndpointWithoutIds {
  endpoint_id: string;
  name: string;
  reason: string;
}

export interface EndpointLive {
  in_flight: number;
  samples_per_second: number;
  completion_tokens_per_second: number;
  p50_latency_ms: number | null;
  /** The cap steered from the server's live load; null while no fresh reading backs it. */
  adaptive_cap: number | null;
  /** The server's last load reading, and when it was taken (ms; null before the first): it ages while the server is down. */
  server: { running: number | null; queued: number | null; token_usage: number | null; cache_hit_rate?: number | null; read_at?: number | null };
}

/**
 * What this process's runner does: it dispatches to the endpoints it drives; on PostgreSQL one
 * replica also coordinates (recovery, shard uploads, forecasts, finishing runs); or it has stopped
 * (shutting down, or taken for dead and not yet started again).
 */
export type RunnerRole = 'coordinating' | 'dispatching' | 'stopped';

/**
 * PostgreSQL: what the other replicas need from the endpoints a replica drives, published with its
 * view. For the coordinator's forecast: each dispatchable endpoint's cap, and per run and endpoint
 * the completion tokens per request-millisecond of its answers over the last minute. For each
 * replica's quality gate: per run and endpoint, the answers in its window and how many were
 * flagged, so an endpoint is judged against its peers whichever replica drives them, and per run
 * the window of kept answers, so the run's gate judges the run's answers, not one replica's.
 */
export interface FleetShare {
  caps: Record<string, number>;
  speeds: Record<string, Record<string, number>>;
  quality?: Record<string, Record<string, [samples: number, flagged: number]>>;
  /** Per run, the replica's own window of its kept answers, for the run's gate: [samples, flagged]. */
  runWindows?: Record<string, [samples: number, flagged: number]>;
}

/** The whole view at one moment: what the runner's worker thread sends to the API thread. */
export interface RunnerSnapshot {
  runs: Record<string, RunProgress>;
  endpoints: Record<string, EndpointLive>;
  /** The sending runner's own role; absent from older snapshots and the idle view. */
  role?: RunnerRole;
  /** PostgreSQL: published by each replica for the forecast; absent from the merged view. */
  fleet?: FleetShare;
}

/** The API thread's handle on the live runner: its view, and a nudge. */
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
  server: { running: null, queued: null, token_usage: null, cache_hit_rate: null, read_at: null },
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
