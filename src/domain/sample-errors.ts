// Why a sample's attempt did not complete: the `error.code` of a failed sample and of an error
// line. One union; the retry reasons in /metrics are derived from it.

export const SAMPLE_ERROR_CODES = {
  /** No answer within the run's request_timeout_ms. */
  timeout: { retryable: true },
  /** The connection failed or was reset. */
  connection_error: { retryable: true },
  /** 5xx, 408, 409 or 425 from the server. */
  server_error: { retryable: true },
  /** 429 (only a gateway in front of SGLang sends it). */
  rate_limited: { retryable: true },
  /** 200 without the shape of a chat completion. */
  malformed_response: { retryable: true },
  /** An answer regen could not take (a fault of its own); tried again. */
  internal_error: { retryable: true },
  /** A 4xx other than the above: the request itself is wrong (e.g. longer than the context). */
  invalid_request: { retryable: false },
} as const satisfies Record<string, { retryable: boolean }>;
export type SampleErrorCode = keyof typeof SAMPLE_ERROR_CODES;

export interface SampleError {
  code: SampleErrorCode;
  message: string;
  status: number | null;
}

export const RETRYABLE_ERROR_CODES = (Object.keys(SAMPLE_ERROR_CODES) as SampleErrorCode[]).filter((c) => SAMPLE_ERROR_CODES[c].retryable);

/** Why a sample went back to the queue: a retryable error, or a flagged answer asked again. */
export const RETRY_REASONS = [...RETRYABLE_ERROR_CODES, 'quality'] as const;
export type RetryReason = SampleErrorCode | 'quality';

/** Codes an OpenAI batch error file gives a request that never ran. */
export const BATCH_UNANSWERED = {
  expired: { code: 'batch_expired', message: 'This request could not be executed before the completion window expired.' },
  cancelled: { code: 'batch_cancelled', message: 'The batch was cancelled before this request was executed.' },
} as const;
