import { APIConnectionError } from 'openai';
import { describe, expect, it } from 'vitest';
import { AnswerBudget, type AnswerCut, AnswerRefused, AnswerShed } from '../../src/runner/answer-budget.js';
import { answerByteLimit, answerLimits, type AnswerLimits, classifyError, parseAnswer } from '../../src/runner/request.js';

describe('AnswerBudget', () => {
  it('cuts an answer at its own bound, and gives its bytes back to the budget', () => {
    const budget = new AnswerBudget(1000);
    const lease = budget.lease(100);
    const cuts: AnswerCut[] = [];
    lease.onCut((err) => cuts.push(err));
    expect(lease.take(60)).toBe(true);
    expect(budget.heldBytes).toBe(60);
    expect(lease.take(60)).toBe(false);
    expect(cuts.map((c) => c instanceof AnswerRefused && c.code)).toEqual(['answer_too_large']);
    expect(cuts[0].message).toContain('more than its request can produce');
    expect(budget.heldBytes).toBe(0);
    // A cut answer takes nothing more, and its release after the request settled changes nothing.
    expect(lease.take(1)).toBe(false);
    lease.release();
    expect(budget.heldBytes).toBe(0);
  });

  it('over the budget cuts the answer holding the most, whichever took last', () => {
    const budget = new AnswerBudget(100);
    const [big, small] = [budget.lease(1000), budget.lease(1000)];
    const cut: string[] = [];
    big.onCut(() => cut.push('big'));
    small.onCut(() => cut.push('small'));
    expect(big.take(70)).toBe(true);
    expect(small.take(20)).toBe(true);
    expect(small.take(20)).toBe(true);
    expect(cut).toEqual(['big']);
    expect(big.refused?.message).toContain('memory budget of 100 bytes');
    expect(budget.heldBytes).toBe(40);
  });

  it("over the budget gives the answer back as regen's own limit, not as the server's answer_too_large", () => {
    const budget = new AnswerBudget(100);
    const [long, short] = [budget.lease(1000), budget.lease(1000)];
    const cuts: AnswerCut[] = [];
    long.onCut((err) => cuts.push(err));
    short.onCut((err) => cuts.push(err));
    expect(long.take(90)).toBe(true);
    expect(short.take(20)).toBe(true);
    // The long answer was well within its own bound of 1000 bytes: the overflow is not its server's fault.
    expect(cuts).toHaveLength(1);
    expect(cuts[0]).toBeInstanceOf(AnswerShed);
    expect(cuts[0]).not.toBeInstanceOf(AnswerRefused);
    expect(long.refused).toBe(cuts[0]);
    expect(long.take(1)).toBe(false);
    // Past its own bound an answer is still the server's fault.
    expect(short.take(990)).toBe(false);
    expect(short.refused).toBeInstanceOf(AnswerRefused);
    expect((short.refused as AnswerRefused).code).toBe('answer_too_large');
  });

  it('counts what is given back: a stream holds only its unread part', () => {
    const budget = new AnswerBudget(100);
    const lease = budget.lease(1000);
    lease.onCut(() => {
      throw new Error('not cut');
    });
    for (let i = 0; i < 50; i++) {
      expect(lease.take(80)).toBe(true);
      lease.give(80);
    }
    expect(budget.heldBytes).toBe(0);
    lease.take(30);
    lease.release();
    expect(budget.heldBytes).toBe(0);
  });
});

describe('answerByteLimit', () => {
  const limit = (body: Record<string, unknown>, context: number | null) => answerByteLimit(body, answerLimits(body, context));

  it('grows with max_tokens (capped at the context), n and logprobs', () => {
    const base = limit({ max_tokens: 1000 }, 32_768);
    const perThousand = limit({ max_tokens: 2000 }, 32_768) - base;
    const envelope = base - perThousand;
    expect(perThousand).toBeGreaterThan(0);
    expect(envelope).toBeGreaterThan(0);
    expect(limit({ max_tokens: 1_000_000 }, 32_768)).toBe(limit({}, 32_768));
    expect(limit({ max_tokens: 1000, n: 2 }, 32_768)).toBe(envelope + 2 * perThousand);
    expect(limit({ max_tokens: 1000, logprobs: true }, 32_768)).toBeGreaterThan(base);
    expect(limit({ max_tokens: 1000, logprobs: true, top_logprobs: 5 }, 32_768)).toBeGreaterThan(limit({ max_tokens: 1000, logprobs: true }, 32_768));
    // A server that reports no context bounds nothing a run may ask for.
    expect(limit({ max_tokens: 10_000_000 }, null)).toBeGreaterThan(limit({}, 32_768));
  });
});

describe('parseAnswer: token counts', () => {
  const answer = (usage: Record<string, unknown>) => ({ choices: [{ message: { content: 'hi' }, finish_reason: 'stop' }], usage });
  const limits: AnswerLimits = { contextLength: 1000, choices: 1 };
  const bad: [string, Record<string, unknown>, typeof limits?][] = [
    ['negative prompt tokens', { prompt_tokens: -5, completion_tokens: 3 }],
    ['1e308 completion tokens', { prompt_tokens: 5, completion_tokens: 1e308 }],
    ['fractional completion tokens', { prompt_tokens: 5, completion_tokens: 2.5 }],
    ['completion tokens as a string', { prompt_tokens: 5, completion_tokens: '3' }],
    ['a prompt longer than the context', { prompt_tokens: 1001, completion_tokens: 3 }],
    ['more completion tokens than the context', { prompt_tokens: 5, completion_tokens: 1001 }],
    ['negative reasoning tokens', { prompt_tokens: 5, completion_tokens: 3, reasoning_tokens: -1 }],
    ['cached tokens past the context', { prompt_tokens: 5, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 1e9 } }],
    ['more than an unknown context could hold', { prompt_tokens: 5, completion_tokens: 1e15 }, { contextLength: null, choices: 1 }],
  ];
  for (const [name, usage, l] of bad) {
    it(`rejects ${name} as malformed_response`, () => {
      const parsed = parseAnswer(answer(usage), l ?? limits);
      expect(parsed.ok).toBe(false);
      expect(!parsed.ok && parsed.error.code).toBe('malformed_response');
      expect(!parsed.ok && parsed.error.message).toMatch(/^the endpoint reported usage\.\w+ /);
    });
  }

  it('takes counts up to the context, times n for what the choices generate', () => {
    expect(parseAnswer(answer({ prompt_tokens: 1000, completion_tokens: 1000 }), limits).ok).toBe(true);
    expect(parseAnswer(answer({ prompt_tokens: 10, completion_tokens: 1800 }), { contextLength: 1000, choices: 2 }).ok).toBe(true);
    expect(parseAnswer(answer({}), limits).ok).toBe(true);
  });

  const clamped: [string, Record<string, unknown>, Record<string, number>, string[]][] = [
    [
      'cached tokens past the prompt',
      { prompt_tokens: 10, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 500 } },
      { cached_tokens: 10 },
      ['cached_tokens_clamped'],
    ],
    [
      "SGLang's reasoning tokens past the completion",
      { prompt_tokens: 10, completion_tokens: 3, reasoning_tokens: 9 },
      { reasoning_tokens: 3 },
      ['reasoning_tokens_clamped'],
    ],
    [
      "OpenAI's reasoning tokens past the completion, with cached tokens past the prompt",
      { prompt_tokens: 10, completion_tokens: 3, completion_tokens_details: { reasoning_tokens: 4 }, prompt_tokens_details: { cached_tokens: 11 } },
      { reasoning_tokens: 3, cached_tokens: 10 },
      ['cached_tokens_clamped', 'reasoning_tokens_clamped'],
    ],
  ];
  for (const [name, usage, fixed, repairs] of clamped) {
    it(`keeps an answer with ${name}, that count clamped and the repair named`, () => {
      const parsed = parseAnswer(answer(usage), limits);
      expect(parsed.ok).toBe(true);
      if (!parsed.ok) return;
      expect(parsed.answer.usage).toEqual({ prompt_tokens: 10, completion_tokens: 3, reasoning_tokens: 0, cached_tokens: 0, ...fixed });
      expect(parsed.answer.repairs).toEqual(repairs);
    });
  }

  it('names no repair on an answer whose counts hold', () => {
    const parsed = parseAnswer(answer({ prompt_tokens: 10, completion_tokens: 3, reasoning_tokens: 3, prompt_tokens_details: { cached_tokens: 10 } }), limits);
    expect(parsed.ok && parsed.answer.repairs).toBeUndefined();
  });
});

describe('parseAnswer: text', () => {
  const answer = (content: string, reasoning: string | null) => ({ choices: [{ message: { content, reasoning_content: reasoning }, finish_reason: 'stop' }] });

  it('replaces unpaired surrogates with U+FFFD in content and reasoning, and says so once', () => {
    const parsed = parseAnswer(answer('a\ud800b\udc00', '\udbff'));
    expect(parsed.ok && [parsed.answer.content, parsed.answer.reasoning]).toEqual(['a\ufffdb\ufffd', '\ufffd']);
    expect(parsed.ok && parsed.answer.repairs).toEqual(['lone_surrogates_replaced']);
  });

  it('keeps paired surrogates (an emoji) as they are', () => {
    const parsed = parseAnswer(answer('ok \ud83d\ude00', null));
    expect(parsed.ok && parsed.answer.content).toBe('ok \ud83d\ude00');
    expect(parsed.ok && parsed.answer.repairs).toBeUndefined();
  });
});

describe('classifyError: answers regen refused', () => {
  it('reads answer_too_large and malformed_response, bare or as the cause of a connection error, as no transport failure', () => {
    for (const code of ['answer_too_large', 'malformed_response'] as const) {
      const refused = new AnswerRefused(code, 'why');
      const expected = { kind: 'error', error: { code, message: 'why', status: null }, transport: false };
      expect(classifyError(refused, 1000)).toEqual(expected);
      expect(classifyError(new APIConnectionError({ cause: refused }), 1000)).toEqual(expected);
    }
  });
});
