import type { Config } from './config.js';
import type { Db } from './db/client.js';
import type { Logger } from './logger.js';
import type { Stores } from './storage/index.js';
import type { RunnerMetrics } from './runner/protocol.js';
import type { Metrics } from './services/metrics.js';
import type { RunnerView } from './runner/view.js';

/** Everything a route or the runner needs, built once by startServer in src/server.ts (or by a test). */
export interface Deps {
  config: Config;
  db: Db;
  stores: Stores;
  logger: Logger;
  clock: () => number;
  /** This process's Prometheus registry and the counters the runner moves. */
  metrics: Metrics;
  /** Live state of the runner; a process without one reports none. */
  runner: RunnerView;
  /** Starts validating a run's input in the background. */
  startIngest(runId: string): void;
}

/**
 * The part of Deps the runner uses. In its worker thread, `metrics` and `startIngest` are
 * forwarded to the API thread, which owns the Prometheus registry and validation.
 */
export type RunnerDeps = Pick<Deps, 'config' | 'db' | 'stores' | 'logger' | 'clock' | 'startIngest'> & { metrics: RunnerMetrics };
