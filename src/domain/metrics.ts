import type { RetryReason } from './sample-errors.js';

/**
 * The counters the runner moves. A plain interface, so the runner thread can count without loading
 * prom-client: in its worker thread they are forwarded to the API thread's registry.
 */
export interface RunnerMetrics {
  /** An endpoint answered a sample; `flags` is the quality bitmask of the answer. */
  answered(endpointId: string, latencyMs: number, completionTokens: number, flags: number): void;
  retried(reason: RetryReason): void;
  shardUploaded(): void;
  shardUploadFailed(): void;
}
