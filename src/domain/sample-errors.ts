// Why a sample's attempt did not complete: the `error.code` of a failed sample and of an error
// line. One union; the retry reasons in /metrics are derived from it.
//
// `fault` says whose fault it is. A server's faults are tried again on the fleet under a budget of
// their own and do not use up the sample's max_attempts: spread over a healthy fleet they would
// otherwise fail samples at random (at 16% faults, 0.16^5 of them). A sample's own faults count
// against max_attempts.

export const SAMPLE_ERROR_CODES = {
  /** No answer within the run's request_timeout_ms. */
  timeout: { retryable: true, fault: 'server' },
  /** The connection failed or was reset. */
  connection_error: { retryable: true, fault: 'server' },
  /** 5xx (but a gateway's 503 that shed a bulk request), 409 or 425 from the server. */
  server_error: { retryable: true, fault: 'server' },
  /** The server aborted the request (finish_reason "abort": a pause, a weight update, /abort_request). */
  aborted: { retryable: true, fault: 'server' },
  /** 401, 403 or 404: the endpoint refused (a bad key, a wrong URL); it is probed again. */
  endpoint_refused: { retryable: true, fault: 'server' },
  /**
   * 200 with a body that is not a chat completion (HTML, cut-off JSON, an event that is not JSON),
   * a finish_reason SGLang does not send, or token counts the request cannot have.
   */
  malformed_response: { retryable: true, fault: 'server' },
  /** 200 with an answer larger than its request can produce (from max_tokens, n, logprobs and the context): cut there. */
  answer_too_large: { retryable: true, fault: 'server' },
  /** An answer regen could not take (a fault of its own); tried again. */
  internal_error: { retryable: true, fault: 'sample' },
  /** A 4xx other than the above: the request itself is wrong (e.g. longer than the context). */
  invalid_request: { retryable: false, fault: 'sample' },
  /** The answer was cut by max_tokens (finish_reason "length") and the run's on_length is "fail". */
  truncated: { retryable: false, fault: 'sample' },
  /** Under on_length "retry", still cut with max_tokens as large as the context leaves after the prompt. */
  length_exhausted: { retryable: false, fault: 'sample' },
  /** An agentic conversation's step cannot be paired with the source's, with no complete user turn to keep (or on_tool_mismatch "fail"). */
  tool_mismatch: { retryable: false, fault: 'sample' },
} as const satisfies Record<string, { retryable: boolean; fault: 'server' | 'sample' }>;
export type SampleErrorCode = keyof typeof SAMPLE_ERROR_CODES;

export interface SampleError {
  code: SampleErrorCode;
  message: string;
  status: number | null;
}

export const RETRYABLE_ERROR_CODES = (Object.keys(SAMPLE_ERROR_CODES) as SampleErrorCode[]).filter((c) => SAMPLE_ERROR_CODES[c].retryable);

/** Why a sample went back to the queue: a retryable error, a flagged answer asked again, or a cut one asked again with more room (on_length "retry"). */
export const RETRY_REASONS = [...RETRYABLE_ERROR_CODES, 'quality', 'length'] as const;
export type RetryReason = SampleErrorCode | 'quality' | 'length';

/** Codes an OpenAI batch error file gives a request that never ran. */
export const BATCH_UNANSWERED = {
  expired: { code: 'batch_expired', message: 'This request could not be executed before the completion window expired.' },
  cancelled: { code: 'batch_cancelled', message: 'The batch was cancelled before this request was executed.' },
} as const;
