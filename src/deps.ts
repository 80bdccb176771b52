import type { Config } from './config.js';
import type { Db } from './db/client.js';
import type { DeliveryResult } from './db/webhooks.js';
import type { RunnerView } from './domain/live-view.js';
import type { RunnerMetrics } from './domain/metrics.js';
import type { Logger } from './logger.js';
import type { Stores } from './storage/index.js';

/** What a scrape of /metrics reads besides the counters: the store and the live runner. */
export interface MetricsSource {
  db: Db;
  runner: RunnerView;
  defaultConcurrency: number;
  now: number;
}

/** This process's Prometheus metrics (services/metrics.ts) as the API thread moves and reads them. */
export interface ProcessMetrics extends RunnerMetrics {
  webhookAttempted(result: DeliveryResult['kind']): void;
  /** Counts an open event stream; the function returned counts it closed. */
  streamOpened(): () => void;
  render(source: MetricsSource): Promise<string>;
  readonly contentType: string;
}

/** Everything a route or the runner needs, built once by startServer in src/server.ts (or by a test). */
export interface Deps {
  config: Config;
  db: Db;
  stores: Stores;
  logger: Logger;
  clock: () => number;
  /** This process's Prometheus registry and the counters the runner moves. */
  metrics: ProcessMetrics;
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
