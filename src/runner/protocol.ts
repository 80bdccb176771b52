import type { Config } from '../config.js';
import type { RetryReason } from '../domain/sample-errors.js';
import type { RunnerSnapshot } from '../domain/live-view.js';
import type { AnswerRepair } from '../domain/metrics.js';
import type { TurnedAwayReason } from '../domain/turned-away.js';

// What crosses between the API thread (thread.ts) and the runner's worker thread (worker.ts).
// Both sides import these types from here, never from each other.

/** The settings a new runner thread waits for before it starts. */
export interface RunnerThreadInit {
  type: 'init';
  config: Config;
  logLevel: string;
}

/** A metric increment as the runner thread sends it: [endpoint id, latency ms, completion tokens, flag bits]. */
type Answered = [string, number, number, number];
export interface MetricsBatch {
  answered: Answered[];
  retried: RetryReason[];
  repaired: AnswerRepair[];
  /** Each shed answer: failed (true) or given back. */
  shed: boolean[];
  turnedAway: [endpointId: string, reason: TurnedAwayReason][];
  uploads: number;
  uploadFailures: number;
}

export type ToRunner = RunnerThreadInit | { type: 'wake' } | { type: 'flush' } | { type: 'stop'; graceMs: number };
export type FromRunner =
  | { type: 'started' }
  | { type: 'start_failed'; why: 'locked' | 'secret_key' | 'other'; message: string }
  /** A stored secret did not open with this process's key (`SecretBox.whenLockedOut`). */
  | { type: 'locked_out'; message: string }
  | { type: 'log'; line: string }
  | { type: 'metrics'; batch: MetricsBatch }
  | { type: 'snapshot'; snapshot: RunnerSnapshot }
  | { type: 'ingest'; runId: string }
  | { type: 'flushed' }
  | { type: 'stopped' };
