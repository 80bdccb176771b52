import { describe, expect, it } from 'vitest';
import { APIConnectionError, APIConnectionTimeoutError, APIError, APIUserAbortError } from 'openai';
import { claimSize, MAX_CLAIM, pickEndpoint, type Slots } from '../../src/runner/endpoint-choice.js';
import { backoffMs, requestBackoff, storeBackoff } from '../../src/domain/backoff.js';
import { decideFailure } from '../../src/runner/failure-policy.js';
import { buildRequest, classifyError, parseAnswer, retryAfterMs } from '../../src/runner/request.js';

// SGLang's error shapes (docs/sglang.md "Errors"), as the openai client raises them
// once the dispatch fetch has put SGLang's top-level error fields under "error" (http-fetch.ts).
const sglangError = (status: number, message: string) =>
  APIError.generate(status, { error: { object: 'error', message, type: 'BadRequestError', param: null, code: status } }, undefined, new Headers());

describe('classifyError: every SGLang error shape', () => {
  const cases: { name: string; err: unknown; expect: ReturnType<typeof classifyError> }[] = [
    {
      name: 'prompt longer than the context (400)',
      err: sglangError(400, "The input (40000 tokens) is longer than the model's context length (32768 tokens)."),
      expect: {
        kind: 'error',
        transport: false,
        error: { code: 'invalid_request', status: 400, message: "The input (40000 tokens) is longer than the model's context length (32768 tokens)." },
      },
    },
    {
      name: 'prompt + max_tokens over the context (400)',
      err: sglangError(400, "Requested token count exceeds the model's maximum context length of 32768 tokens."),
      expect: {
        kind: 'error',
        transport: false,
        error: { code: 'invalid_request', status: 400, message: "Requested token count exceeds the model's maximum context length of 32768 tokens." },
      },
    },
    {
      name: 'validation error turned 400 by SGLang',
      err: sglangError(400, 'Input should be a valid list'),
      expect: { kind: 'error', transport: false, error: { code: 'invalid_request', status: 400, message: 'Input should be a valid list' } },
    },
    {
      name: 'internal error (500)',
      err: sglangError(500, 'Internal server error: CUDA out of memory'),
      expect: { kind: 'error', transport: false, error: { code: 'server_error', status: 500, message: 'Internal server error: CUDA out of memory' } },
    },
    {
      name: 'queue full (503)',
      err: sglangError(503, 'The request queue is full.'),
      expect: { kind: 'error', transport: false, error: { code: 'server_error', status: 503, message: 'The request queue is full.' } },
    },
    {
      name: 'a gateway rate limit (429) without Retry-After',
      err: sglangError(429, 'Too Many Requests'),
      expect: { kind: 'turned_away', reason: 'rate_limited', retryAfterMs: null, message: 'Too Many Requests' },
    },
    {
      name: 'a gateway rate limit (429) with Retry-After in seconds',
      err: APIError.generate(429, { error: { message: 'slow down' } }, undefined, new Headers({ 'retry-after': '3' })),
      expect: { kind: 'turned_away', reason: 'rate_limited', retryAfterMs: 3000, message: 'slow down' },
    },
    {
      name: 'a gateway shedding a bulk request (503 with X-SMG-Preempted)',
      err: APIError.generate(503, { error: { message: 'preempted' } }, undefined, new Headers({ 'x-smg-preempted': 'true' })),
      expect: { kind: 'turned_away', reason: 'preempted', retryAfterMs: null, message: 'preempted' },
    },
    {
      name: 'a gateway giving up on a queued request (408)',
      err: sglangError(408, 'Request Timeout'),
      expect: { kind: 'turned_away', reason: 'gateway_timeout', retryAfterMs: null, message: 'Request Timeout' },
    },
    {
      name: 'missing API key (401)',
      err: APIError.generate(401, { error: 'Unauthorized' }, undefined, new Headers()),
      expect: {
        kind: 'endpoint_refused',
        reason: expect.stringMatching(/^401: /) as unknown as string,
        error: { code: 'endpoint_refused', status: 401, message: expect.any(String) as unknown as string },
      },
    },
    {
      name: 'wrong URL (404, FastAPI body)',
      err: APIError.generate(404, { error: { detail: 'Not Found' } }, undefined, new Headers()),
      expect: {
        kind: 'endpoint_refused',
        reason: expect.stringMatching(/^404: /) as unknown as string,
        error: { code: 'endpoint_refused', status: 404, message: expect.any(String) as unknown as string },
      },
    },
    {
      name: 'connection refused or reset',
      err: new APIConnectionError({ message: 'Connection error.' }),
      expect: { kind: 'error', transport: true, error: { code: 'connection_error', status: null, message: 'the connection to the endpoint failed' } },
    },
    {
      name: 'client timeout',
      err: new APIConnectionTimeoutError(),
      expect: { kind: 'error', transport: false, error: { code: 'timeout', status: null, message: 'no answer within 1000 ms' } },
    },
    {
      name: 'aborted by its own timeout signal',
      err: new APIUserAbortError(),
      expect: { kind: 'error', transport: false, error: { code: 'timeout', status: null, message: 'no answer within 1000 ms' } },
    },
    {
      name: 'anything else',
      err: new TypeError('boom'),
      expect: { kind: 'error', transport: false, error: { code: 'internal_error', status: null, message: 'boom' } },
    },
  ];
  for (const c of cases) {
    it(c.name, () => {
      expect(classifyError(c.err, 1000)).toEqual(c.expect);
    });
  }
});

describe('classifyError: a server that refuses the priority field', () => {
  const refusal = sglangError(400, 'Priority scheduling is not enabled.');

  it("is the endpoint's when regen sent a priority", () => {
    expect(classifyError(refusal, 1000, true)).toEqual({ kind: 'priority_refused', message: 'Priority scheduling is not enabled.' });
  });

  it("is the request's own when regen sent none", () => {
    expect(classifyError(refusal, 1000, false)).toMatchObject({ kind: 'error', error: { code: 'invalid_request', status: 400 } });
  });
});

describe('retryAfterMs', () => {
  const now = Date.parse('2026-12-06T05:00:00Z');
  it('reads seconds and HTTP dates, bounded, and nothing else', () => {
    expect(retryAfterMs('2', now)).toBe(2000);
    expect(retryAfterMs('Sun, 06 Dec 2026 05:00:07 GMT', now)).toBe(7000);
    expect(retryAfterMs('Sun, 06 Dec 2026 04:00:00 GMT', now)).toBe(0);
    expect(retryAfterMs('999999', now)).toBe(600_000);
    expect(retryAfterMs('soon', now)).toBeNull();
    expect(retryAfterMs(null, now)).toBeNull();
  });
});

describe('parseAnswer', () => {
  const usage = { prompt_tokens: 12, completion_tokens: 30, total_tokens: 42, reasoning_tokens: 20, prompt_tokens_details: null };

  it('reads SGLang usage with top-level reasoning_tokens and null cache details', () => {
    const parsed = parseAnswer({
      id: 'x',
      created: 5,
      model: 'm',
      choices: [{ message: { role: 'assistant', content: 'hi', reasoning_content: 'think' }, finish_reason: 'stop' }],
      usage,
      metadata: { weight_version: 'default' },
    });
    expect(parsed).toEqual({
      ok: true,
      answer: {
        content: 'hi',
        reasoning: 'think',
        toolCalls: null,
        finishReason: 'stop',
        logprobs: null,
        usage: { prompt_tokens: 12, completion_tokens: 30, reasoning_tokens: 20, cached_tokens: 0 },
        model: 'm',
        responseId: 'x',
        created: 5,
      },
    });
  });

  it("keeps the choice's logprobs as the server sent them", () => {
    const logprobs = { content: [{ token: 'hi', logprob: -0.1, bytes: [104, 105], top_logprobs: [] }] };
    const parsed = parseAnswer({ choices: [{ message: { content: 'hi' }, logprobs, finish_reason: 'stop' }], usage });
    expect(parsed.ok && parsed.answer.logprobs).toEqual(logprobs);
  });

  it('reads OpenAI-style reasoning tokens and cache details', () => {
    const parsed = parseAnswer({
      choices: [{ message: { content: '', reasoning_content: null }, finish_reason: 'length' }],
      usage: { prompt_tokens: 1, completion_tokens: 2, completion_tokens_details: { reasoning_tokens: 2 }, prompt_tokens_details: { cached_tokens: 1 } },
    });
    expect(parsed.ok && parsed.answer).toMatchObject({
      content: '',
      reasoning: null,
      finishReason: 'length',
      usage: { reasoning_tokens: 2, cached_tokens: 1 },
    });
  });

  it('never takes an aborted answer for a completion', () => {
    const parsed = parseAnswer({ choices: [{ message: { content: 'partial', reasoning_content: null }, finish_reason: 'abort' }], usage });
    expect(parsed).toEqual({ ok: false, error: { code: 'aborted', message: 'the server aborted the request (finish_reason "abort")', status: null } });
  });

  it('calls a finish_reason SGLang does not send malformed', () => {
    for (const finish_reason of [null, 'eos', 42]) {
      const parsed = parseAnswer({ choices: [{ message: { content: 'x' }, finish_reason }], usage });
      expect(parsed.ok).toBe(false);
      expect(!parsed.ok && parsed.error.code).toBe('malformed_response');
    }
    for (const finish_reason of ['stop', 'length', 'tool_calls', 'content_filter', 'function_call']) {
      expect(parseAnswer({ choices: [{ message: { content: 'x' }, finish_reason }], usage }).ok).toBe(true);
    }
  });

  it('calls an answer without choices malformed', () => {
    for (const res of [null, 'text', {}, { choices: [] }, { choices: 'x' }]) {
      expect(parseAnswer(res)).toEqual({
        ok: false,
        error: { code: 'malformed_response', message: 'the endpoint answered 200 without choices', status: null },
      });
    }
  });
});

describe('buildRequest', () => {
  const run = { model: 'm', params: { temperature: 0.6, seed: 10, chat_template_kwargs: { enable_thinking: true } } };

  it("puts the line's params over the run's, and the run's model last", () => {
    const built = buildRequest(run, { request: JSON.stringify({ messages: [{ role: 'user', content: 'q' }], params: { temperature: 0 } }), qualityRetries: 0 });
    expect(built.body).toEqual({
      temperature: 0,
      seed: 10,
      chat_template_kwargs: { enable_thinking: true },
      model: 'm',
      messages: [{ role: 'user', content: 'q' }],
    });
    expect(built.thinking).toBe(true);
  });

  it('asks a quality retry with another seed', () => {
    const request = JSON.stringify({ messages: [] });
    const first = buildRequest(run, { request, qualityRetries: 1 }, () => 0).body.seed;
    const second = buildRequest(run, { request, qualityRetries: 2 }, () => 0).body.seed;
    expect(first).not.toBe(10);
    expect(second).not.toBe(first);
  });
});

describe('pickEndpoint', () => {
  const pick = (slots: (Slots & { id: string })[]) => pickEndpoint(slots, (s) => s)?.id ?? null;

  it('takes the endpoint with the most free room relative to its cap', () => {
    expect(
      pick([
        { id: 'a', cap: 100, inFlight: 60, weight: 1 },
        { id: 'b', cap: 10, inFlight: 3, weight: 1 },
      ]),
    ).toBe('b');
  });

  it('breaks a tie by weight, and keeps the first on a full tie', () => {
    expect(
      pick([
        { id: 'a', cap: 10, inFlight: 5, weight: 1 },
        { id: 'b', cap: 20, inFlight: 10, weight: 2 },
      ]),
    ).toBe('b');
    expect(
      pick([
        { id: 'a', cap: 10, inFlight: 5, weight: 1 },
        { id: 'b', cap: 20, inFlight: 10, weight: 1 },
      ]),
    ).toBe('a');
  });

  it('finds nothing when every endpoint is full or excluded', () => {
    expect(pick([{ id: 'a', cap: 4, inFlight: 4, weight: 1 }])).toBeNull();
    expect(pickEndpoint([{ id: 'a', cap: 4, inFlight: 0, weight: 1 }], () => null)).toBeNull();
  });
});

describe('claimSize', () => {
  it('claims the free slots, at least half the fleet, at most MAX_CLAIM', () => {
    expect(claimSize(3, 100)).toBe(50);
    expect(claimSize(80, 100)).toBe(80);
    expect(claimSize(0, 0)).toBe(1);
    expect(claimSize(5000, 8000)).toBe(MAX_CLAIM);
  });
});

describe('backoff', () => {
  it('doubles from the first wait up to the cap', () => {
    const waits = [1, 2, 3, 4, 5, 6, 7, 8].map((n) => backoffMs(n, storeBackoff(2000)));
    expect(waits).toEqual([2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]);
  });

  it('jitters request retries over the upper half of the wait', () => {
    expect(backoffMs(1, requestBackoff(500), () => 0)).toBe(250);
    expect(backoffMs(1, requestBackoff(500), () => 1)).toBe(500);
    expect(backoffMs(20, requestBackoff(500), () => 1)).toBe(30_000);
  });
});

describe('decideFailure', () => {
  const e = (code: 'server_error' | 'invalid_request' | 'aborted' | 'internal_error') => ({ code, message: 'x', status: null });
  const budget = (attempts: number, serverFaults: number) => ({ attempts, maxAttempts: 5, serverFaults, maxServerFaults: 20, retryMs: 500 });

  it("fails the request's own error at once", () => {
    expect(decideFailure(e('invalid_request'), budget(1, 0))).toEqual({ kind: 'failed' });
  });

  it("retries the server's faults under their own budget, whatever the attempts", () => {
    expect(decideFailure(e('server_error'), budget(5, 0), () => 1)).toEqual({ kind: 'retry', delayMs: 500, serverFault: true });
    expect(decideFailure(e('aborted'), budget(5, 3), () => 1)).toEqual({ kind: 'retry', delayMs: 4000, serverFault: true });
    expect(decideFailure(e('server_error'), budget(1, 19))).toEqual({ kind: 'failed' });
  });

  it("spends the sample's attempts on its own faults", () => {
    expect(decideFailure(e('internal_error'), budget(1, 0), () => 1)).toEqual({ kind: 'retry', delayMs: 500, serverFault: false });
    expect(decideFailure(e('internal_error'), budget(5, 0))).toEqual({ kind: 'failed' });
  });
});
