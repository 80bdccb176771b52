import { describe, expect, it } from 'vitest';
import { calibrationLines, calibrationSeqs } from '../../src/domain/forecast.js';
import { parseInputLine } from '../../src/domain/input-line.js';
import { MAX_SAMPLES_PER_LINE, Params } from '../../src/domain/params.js';
import { samplesPerLine, samplesPerLineProblem } from '../../src/domain/run-settings.js';
import { takeSiblings, type Claimed } from '../../src/runner/claim-buffer.js';
import { apportion, choiceOrder, requestSample, shareUsage } from '../../src/runner/choices.js';
import { buildRequest, parseAnswers } from '../../src/runner/request.js';
import { buildReply, parseChatRequest } from '../../src/sim/completion.js';
import { DEFAULTS } from '../../src/sim/options.js';

// params.n > 1: the pure parts. Which samples go out together, which choice answers which sample,
// how the one usage of a request is shared, and what is refused.

const claimed = (customId: string, sampleIndex: number, id = 0): Claimed => ({
  id,
  runId: 'run_1',
  shardIdx: 0,
  customId,
  sampleIndex,
  request: '{"messages":[]}',
  attempts: 1,
  qualityRetries: 0,
  serverFaults: 0,
  variant: null,
  maxTokens: null,
  turn: null,
  affinityEndpointId: null,
  since: 0,
});

const usage = { prompt_tokens: 100, completion_tokens: 300, reasoning_tokens: 90, cached_tokens: 40 };
const choice = (index: number, content: string, finish = 'stop', reasoning: string | null = null) => ({
  index,
  message: { role: 'assistant', content, reasoning_content: reasoning },
  finish_reason: finish,
});

describe('grouping a line’s answers', () => {
  it('takes the answers right after the first, then those a claim added at its end, up to n', () => {
    const buffer = [claimed('a', 1), claimed('a', 2), claimed('b', 0), claimed('b', 1), claimed('c', 0), claimed('a', 0)];
    const group = [buffer.shift()!];
    takeSiblings(buffer, 'a', 3, group);
    expect(group.map((s) => `${s.customId}${s.sampleIndex}`)).toEqual(['a1', 'a2', 'a0']);
    expect(buffer.map((s) => `${s.customId}${s.sampleIndex}`)).toEqual(['b0', 'b1', 'c0']);
  });

  it('stops at n and leaves other lines alone; a lone retry stays alone', () => {
    const buffer = [claimed('b', 1), claimed('c', 0), claimed('c', 1)];
    const group = [claimed('b', 0)];
    takeSiblings(buffer, 'b', 2, group);
    expect(group).toHaveLength(2);
    expect(buffer.map((s) => s.customId)).toEqual(['c', 'c']);
    const lone = [claimed('z', 2)];
    takeSiblings(buffer, 'z', 3, lone);
    expect(lone).toHaveLength(1);
    expect(buffer).toHaveLength(2);
  });

  it('puts a group in choice order: choice i answers the i-th by sample_index', () => {
    expect(choiceOrder([claimed('a', 2), claimed('a', 0), claimed('a', 1)]).map((s) => s.sampleIndex)).toEqual([0, 1, 2]);
  });

  it('asks n = the group’s size, and no n for one answer asked again alone', () => {
    const run = { model: 'm', params: { n: 4, temperature: 0.7 } };
    const sample = { request: JSON.stringify({ messages: [{ role: 'user', content: 'q' }] }), qualityRetries: 0 };
    expect(buildRequest(run, sample, Math.random, 4).body).toMatchObject({ n: 4, temperature: 0.7 });
    expect(buildRequest(run, sample, Math.random, 2).body.n).toBe(2);
    expect('n' in buildRequest(run, sample, Math.random, 1).body).toBe(false);
  });
});

describe('the calibration slice', () => {
  it('takes whole lines, about k samples of them, spread over the input', () => {
    const seqs = calibrationLines('run_x', 3000, 200, 3);
    expect(seqs.length).toBe(201);
    const lines = new Map<number, number[]>();
    for (const q of seqs) lines.set(Math.floor(q / 3), [...(lines.get(Math.floor(q / 3)) ?? []), q % 3]);
    expect(lines.size).toBe(67);
    for (const answers of lines.values()) expect(answers).toEqual([0, 1, 2]);
    expect(Math.max(...seqs)).toBeGreaterThan(2700);
    expect(calibrationLines('run_x', 3000, 200, 1)).toEqual(calibrationSeqs('run_x', 3000, 200));
  });
});

describe('mapping choices to samples', () => {
  const limits = { contextLength: 4096, choices: 3 };

  it('reads each choice by its index, whatever order the server sent them in', () => {
    const parsed = parseAnswers({ choices: [choice(2, 'two'), choice(0, 'zero'), choice(1, 'one', 'length')], usage }, limits, 3);
    expect(parsed.map((p) => (p.ok ? [p.answer.content, p.answer.finishReason] : null))).toEqual([
      ['zero', 'stop'],
      ['one', 'length'],
      ['two', 'stop'],
    ]);
  });

  it('fails a missing or aborted choice alone; a body without choices or with impossible usage fails them all', () => {
    const some = parseAnswers({ choices: [choice(0, 'zero'), choice(2, '', 'abort')], usage }, limits, 3);
    expect(some[0].ok).toBe(true);
    expect(some[1]).toMatchObject({ ok: false, error: { code: 'malformed_response', message: 'the endpoint answered without choice 1 of the 3 asked' } });
    expect(some[2]).toMatchObject({ ok: false, error: { code: 'aborted' } });
    const none = parseAnswers({ choices: [] }, limits, 3);
    expect(none.every((p) => !p.ok && p.error.code === 'malformed_response')).toBe(true);
    const absurd = parseAnswers({ choices: [choice(0, 'a'), choice(1, 'b'), choice(2, 'c')], usage: { ...usage, completion_tokens: 4096 * 3 + 1 } }, limits, 3);
    expect(absurd.every((p) => !p.ok)).toBe(true);
  });

  it('takes choices by position when the server gives no index', () => {
    const parsed = parseAnswers(
      {
        choices: [
          { message: { content: 'x' }, finish_reason: 'stop' },
          { message: { content: 'y' }, finish_reason: 'stop' },
        ],
        usage,
      },
      limits,
      2,
    );
    expect(parsed.map((p) => p.ok && p.answer.content)).toEqual(['x', 'y']);
  });
});

describe('sharing one usage among n choices', () => {
  it('apportions whole parts that add up exactly', () => {
    expect(apportion(10, [1, 1, 1])).toEqual([4, 3, 3]);
    expect(apportion(300, [100, 200, 0])).toEqual([100, 200, 0]);
    expect(apportion(7, [0, 0])).toEqual([4, 3]);
    for (const total of [0, 1, 17, 1001]) expect(apportion(total, [3, 5, 8, 13]).reduce((a, b) => a + b, 0)).toBe(total);
  });

  it('puts the prompt on the first choice and shares the generated tokens by each choice’s text', () => {
    const answers = [
      { content: 'a'.repeat(100), reasoning: 'r'.repeat(50) },
      { content: 'b'.repeat(200), reasoning: 'r'.repeat(100) },
      { content: '', reasoning: null },
    ];
    const parts = shareUsage(usage, answers);
    expect(parts.map((p) => p.prompt_tokens)).toEqual([100, 0, 0]);
    expect(parts.map((p) => p.cached_tokens)).toEqual([40, 0, 0]);
    expect(parts.reduce((a, p) => a + p.completion_tokens, 0)).toBe(300);
    expect(parts.reduce((a, p) => a + p.reasoning_tokens, 0)).toBe(90);
    expect(parts[1].completion_tokens).toBeGreaterThan(parts[0].completion_tokens);
    expect(parts[2].completion_tokens).toBeLessThanOrEqual(1);
    expect(parts.map((p) => p.reasoning_tokens)).toEqual([30, 60, 0]);
    // One choice keeps the usage as it came.
    expect(shareUsage(usage, [answers[0]])).toEqual([usage]);
  });

  it('gives a choice that did not come back no part', () => {
    const parts = shareUsage(usage, [{ content: 'x', reasoning: null }, null]);
    expect(parts[1]).toEqual({ prompt_tokens: 0, cached_tokens: 0, completion_tokens: 0, reasoning_tokens: 0 });
    expect(parts[0].completion_tokens).toBe(300);
  });

  it('puts the prompt on the first choice that came back when choice 0 did not', () => {
    const parts = shareUsage(usage, [null, { content: 'x', reasoning: null }, { content: 'y', reasoning: null }]);
    expect(parts.map((p) => p.prompt_tokens)).toEqual([0, 100, 0]);
    expect(parts.map((p) => p.cached_tokens)).toEqual([0, 40, 0]);
  });
});

describe('what is refused', () => {
  it('takes n at the run from 1 to its bound', () => {
    expect(Params.safeParse({ n: 3 }).success).toBe(true);
    expect(Params.safeParse({ n: MAX_SAMPLES_PER_LINE + 1 }).success).toBe(false);
    expect(Params.safeParse({ n: 0 }).success).toBe(false);
    expect(samplesPerLine({ n: 3 })).toBe(3);
    expect(samplesPerLine({})).toBe(1);
  });

  it('refuses n > 1 in a line’s own params', () => {
    const line = JSON.stringify({ custom_id: 'x', messages: [{ role: 'user', content: 'q' }], params: { n: 2 } });
    const parsed = parseInputLine(line, 1, { regenerate: null });
    expect(parsed.ok).toBe(false);
    expect(!parsed.ok && parsed.reason).toMatch(/params\.n: n > 1 is a run's setting/);
    expect(parseInputLine(JSON.stringify({ custom_id: 'x', messages: [{ role: 'user', content: 'q' }], params: { n: 1 } }), 1, { regenerate: null }).ok).toBe(
      true,
    );
  });

  it('refuses n > 1 with conversations regenerated turn by turn, saying why', () => {
    expect(samplesPerLineProblem({ n: 2 }, 'all_assistant')).toMatch(/multiply every later turn's prefix by n.*n runs/);
    expect(samplesPerLineProblem({ n: 1 }, 'all_assistant')).toBeNull();
    expect(samplesPerLineProblem({ n: 2 }, 'last_assistant')).toBeNull();
    expect(samplesPerLineProblem(undefined, 'all_assistant')).toBeNull();
  });
});

describe('the simulator answers n', () => {
  const knobs = { ...DEFAULTS };
  const plan = { degenerate: false, cachedTokens: 0, abortAt: undefined };

  it('with n choices, each its own index and text, and one usage summing them', () => {
    const request = parseChatRequest({ messages: [{ role: 'user', content: 'hi [len=20]' }], n: 3 }, knobs);
    const body = buildReply(request, knobs, plan).body as any;
    expect(body.choices.map((c: any) => c.index)).toEqual([0, 1, 2]);
    expect(new Set(body.choices.map((c: any) => c.message.content)).size).toBe(3);
    expect(body.usage.completion_tokens).toBe(3 * (20 + knobs.reasoningTokens));
    // Choice 0 is what a request for one choice gets.
    const one = buildReply(parseChatRequest({ messages: [{ role: 'user', content: 'hi [len=20]' }] }, knobs), knobs, plan).body as any;
    expect(one.choices[0].message.content).toBe(body.choices[0].message.content);
  });

  it('spoils the choice "[empty-choice=K]" names, only when there is one', () => {
    const messages = [{ role: 'user', content: 'hi [empty-choice=1]' }];
    const three = buildReply(parseChatRequest({ messages, n: 3 }, knobs), knobs, plan).body as any;
    expect(three.choices.map((c: any) => c.message.content === 'OK.')).toEqual([false, true, false]);
    const one = buildReply(parseChatRequest({ messages }, knobs), knobs, plan).body as any;
    expect(one.choices[0].message.content).not.toBe('OK.');
  });

  it('refuses an n that is not a positive integer', () => {
    expect(() => parseChatRequest({ messages: [{ role: 'user', content: 'x' }], n: 0 }, knobs)).toThrow(/`n` must be/);
  });
});

describe('the request for answers of one line asked again together', () => {
  const request = JSON.stringify({ messages: [{ role: 'user', content: 'q' }] });
  const run = { model: 'm', params: { n: 3, max_tokens: 30, seed: 5 } };

  it('takes the largest max_tokens an on_length retry raised and the most quality retries of the group', () => {
    const flagged = { request, sampleIndex: 0, qualityRetries: 1, maxTokens: null as number | null };
    const cut = { request, sampleIndex: 1, qualityRetries: 0, maxTokens: 60 };
    const sample = requestSample([flagged, cut]);
    expect(sample).toMatchObject({ sampleIndex: 0, qualityRetries: 1, maxTokens: 60 });
    const { body } = buildRequest(run, sample, () => 0, 2);
    expect(body).toMatchObject({ n: 2, max_tokens: 60 });
    expect(body.seed).not.toBe(5);
    // A group of one is its sample as it is.
    expect(requestSample([flagged])).toEqual(flagged);
    expect(requestSample([cut, { ...cut, sampleIndex: 2, maxTokens: 120 }]).maxTokens).toBe(120);
  });
});
