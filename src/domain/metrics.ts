import type { RetryReason } from './sample-errors.js';
import type { TurnedAwayReason } from './turned-away.js';

/**
 * The counters the runner moves. A plain interface, so the runner thread can count without loading
 * prom-client: in its worker thread they are forwarded to the API thread's registry.
 */
export interface RunnerMetrics {
  /** An endpoint answered a sample; `flags` is the quality bitmask of the answer. */
  answered(endpointId: string, latencyMs: number, completionTokens: number, flags: number): void;
  retried(reason: RetryReason): void;
  /** An endpoint turned a request away for a while (its choice, not a fault). */
  turnedAway(endpointId: string, reason: TurnedAwayReason): void;
  shardUploaded(): void;
  shardUploadFailed(): void;
}
