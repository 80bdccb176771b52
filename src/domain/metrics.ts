import type { RetryReason } from './sample-errors.js';
import type { TurnedAwayReason } from './turned-away.js';

/**
 * What regen mends in an answer it keeps, counted in regen_answer_repairs_total: a cached or
 * reasoning token count past the count it is part of, clamped to it (docs/sglang.md says why it is
 * not asked again); an unpaired surrogate in the text, replaced by U+FFFD.
 */
export const ANSWER_REPAIRS = ['cached_tokens_clamped', 'reasoning_tokens_clamped', 'lone_surrogates_replaced'] as const;
export type AnswerRepair = (typeof ANSWER_REPAIRS)[number];

/**
 * The counters the runner moves. A plain interface, so the runner thread can count without loading
 * prom-client: in its worker thread they are forwarded to the API thread's registry.
 */
export interface RunnerMetrics {
  /** An endpoint answered a sample; `flags` is the quality bitmask of the answer. */
  answered(endpointId: string, latencyMs: number, completionTokens: number, flags: number): void;
  retried(reason: RetryReason): void;
  /** An answer kept was mended (counted once a request for its usage, once a choice for its text). */
  repaired(repair: AnswerRepair): void;
  /** An answer was cut to keep the memory budget: its samples given back, or failed once they had been cut too often. */
  shed(failed: boolean): void;
  /** An endpoint turned a request away for a while (its choice, not a fault). */
  turnedAway(endpointId: string, reason: TurnedAwayReason): void;
  shardUploaded(): void;
  shardUploadFailed(): void;
}
