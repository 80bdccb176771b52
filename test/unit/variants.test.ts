import { describe, expect, it } from 'vitest';
import { ASSIGN_SALTS, pickWeighted } from '../../src/domain/assign.js';
import { flagBit, flagsFromBits } from '../../src/domain/flags.js';
import { computeForecast, seededRandom, variantMean, type ForecastInput } from '../../src/domain/forecast.js';
import { MAX_METADATA_BYTES, parseInputLine } from '../../src/domain/input-line.js';
import { outputLine } from '../../src/domain/output-line.js';
import { RunQuality } from '../../src/domain/run-quality.js';
import { variantIndex, Variants } from '../../src/domain/variants.js';
import { layeredParams } from '../../src/domain/run-settings.js';
import { nextMaxTokens, settleAnswer, type Attempt } from '../../src/runner/outcomes.js';
import { buildRequest, type Answer } from '../../src/runner/request.js';

const THINK = { chat_template_kwargs: { enable_thinking: true } };
const PLAIN = { chat_template_kwargs: { enable_thinking: false } };

describe('variants', () => {
  it('take shares within 3 points of their weights on 2,000 prompts, the same for the same custom_id', () => {
    const variants = [
      { name: 'low', weight: 4 },
      { name: 'medium', weight: 4 },
      { name: 'high', weight: 2 },
    ];
    const counts = [0, 0, 0];
    for (let i = 0; i < 2000; i++) {
      const v = variantIndex(`q-${i}`, variants)!;
      expect(v).toBe(pickWeighted(`q-${i}`, [4, 4, 2], ASSIGN_SALTS.variant));
      counts[v]!++;
    }
    expect(Math.abs(counts[0]! / 2000 - 0.4)).toBeLessThan(0.03);
    expect(Math.abs(counts[1]! / 2000 - 0.4)).toBeLessThan(0.03);
    expect(Math.abs(counts[2]! / 2000 - 0.2)).toBeLessThan(0.03);
    expect(variantIndex('q-1', null)).toBeNull();
  });

  it('are refused with the field at fault: names twice, bad names, weights, n', () => {
    const issue = (v: unknown) => {
      const r = Variants.safeParse(v);
      return r.success ? null : { path: r.error.issues[0]!.path.join('.'), message: r.error.issues[0]!.message };
    };
    expect(issue([{ name: 'a', weight: 1 }])).toBeNull();
    expect(issue([])).toMatchObject({ path: '' });
    expect(issue([{ name: 'a b', weight: 1 }])).toMatchObject({ path: '0.name' });
    expect(issue([{ name: 'a', weight: 0 }])).toMatchObject({ path: '0.weight' });
    expect(
      issue([
        { name: 'a', weight: 1 },
        { name: 'a', weight: 2 },
      ]),
    ).toMatchObject({ path: '1.name', message: expect.stringMatching(/unique/) });
    expect(issue([{ name: 'a', weight: 1, params: { n: 1 } }])).toMatchObject({ path: '0.params.n', message: expect.stringMatching(/run only/) });
    expect(issue(Array.from({ length: 17 }, (_, i) => ({ name: `v${i}`, weight: 1 })))).toMatchObject({ message: expect.stringMatching(/16/) });
    // Params are checked as a run's are.
    expect(issue([{ name: 'a', weight: 1, params: { enable_thinking: false } }])).toMatchObject({ path: '0.params.enable_thinking' });
  });

  it('lay params run, then variant, then line', () => {
    expect(layeredParams({ temperature: 0.6, max_tokens: 100 }, { max_tokens: 200, ...PLAIN }, { max_tokens: 300 })).toEqual({
      temperature: 0.6,
      max_tokens: 300,
      ...PLAIN,
    });
    const run = { model: 'Qwen/Qwen3-8B', params: { temperature: 0.6, ...THINK }, variants: [{ params: THINK }, { params: PLAIN }] };
    const request = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], metadata: { source: 'x' } });
    const think = buildRequest(run, { request, qualityRetries: 0, variant: 0 });
    const plain = buildRequest(run, { request, qualityRetries: 0, variant: 1 });
    expect(think.thinking).toBe(true);
    expect(plain.thinking).toBe(false);
    expect(plain.body).toEqual({ temperature: 0.6, ...PLAIN, model: run.model, messages: [{ role: 'user', content: 'hi' }] });
    // The line's own params win over its variant's; metadata is never sent.
    const own = JSON.stringify({ messages: [], params: THINK });
    expect(buildRequest(run, { request: own, qualityRetries: 0, variant: 1 }).thinking).toBe(true);
    // A max_tokens raised by on_length "retry" wins over all.
    expect(buildRequest({ ...run, params: { max_tokens: 100 } }, { request, qualityRetries: 0, variant: 1, maxTokens: 400 }).body.max_tokens).toBe(400);
  });

  it('merge chat_template_kwargs one level deep, run then variant then line, the later layer winning a kwarg', () => {
    const run = { temperature: 0.6, chat_template_kwargs: { enable_thinking: false, run_kw: 1 } };
    const variant = { chat_template_kwargs: { variant_kw: 2, run_kw: 10 } };
    const line = { chat_template_kwargs: { line_kw: 3 } };
    expect(layeredParams(run, variant, null)).toEqual({ temperature: 0.6, chat_template_kwargs: { enable_thinking: false, run_kw: 10, variant_kw: 2 } });
    expect(layeredParams(run, null, line)).toEqual({ temperature: 0.6, chat_template_kwargs: { enable_thinking: false, run_kw: 1, line_kw: 3 } });
    expect(layeredParams(run, variant, { chat_template_kwargs: { enable_thinking: true } }).chat_template_kwargs).toEqual({
      enable_thinking: true,
      run_kw: 10,
      variant_kw: 2,
    });
    // A layer without kwargs leaves the others' as they are, and the run's own object is never changed.
    expect(layeredParams(run, { max_tokens: 5 }, null).chat_template_kwargs).toEqual(run.chat_template_kwargs);
    expect(run.chat_template_kwargs).toEqual({ enable_thinking: false, run_kw: 1 });
    const built = buildRequest(
      { model: 'Qwen/Qwen3-8B', params: run, variants: [{ params: variant }] },
      { request: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], params: line }), qualityRetries: 0, variant: 0 },
    );
    expect(built.body.chat_template_kwargs).toEqual({ enable_thinking: false, run_kw: 10, variant_kw: 2, line_kw: 3 });
    expect(built.thinking).toBe(false);
  });

  it('are judged against their own answers: short plain answers among long thinking ones are not short_for_run', () => {
    const mixed = (perVariant: boolean) => {
      const q = new RunQuality({ min_completion_tokens: 0, model: 'Qwen/Qwen3-8B' });
      let short = 0;
      for (let i = 0; i < 2000; i++) {
        const plain = i % 10 < 3;
        const input = plain
          ? { content: `Answer ${i}: ${i * 7}.`, reasoning_content: null, finish_reason: 'stop', completion_tokens: 12, thinking_requested: false }
          : {
              content: `Answer ${i}: done.`,
              reasoning_content: `Thinking about ${i} at length.`,
              finish_reason: 'stop',
              completion_tokens: 600,
              thinking_requested: true,
            };
        const flags = q.check(input, 'e1', perVariant ? (plain ? 1 : 0) : null);
        expect(flagsFromBits(flags)).not.toContain('missing_reasoning');
        if (flags & flagBit('short_for_run')) short++;
      }
      return short;
    };
    expect(mixed(true)).toBe(0);
    // The same answers judged as one run: the plain ones are far below the run's median.
    expect(mixed(false)).toBeGreaterThan(400);
  });

  it('pause the run when one variant is broken, however small its share; a healthy mix is never paused', () => {
    const gate = { min_samples: 200, max_flag_rate: 0.2 };
    const run = (brokenPlain: boolean) => {
      const q = new RunQuality({ min_completion_tokens: 0, model: 'Qwen/Qwen3-8B', variants: ['think', 'plain'] });
      for (let i = 0; i < 4000; i++) {
        const plain = i % 10 === 0;
        const input = plain
          ? {
              content: brokenPlain ? '' : `Answer ${i}: ${i * 7}.`,
              reasoning_content: null,
              finish_reason: 'stop',
              completion_tokens: 12,
              thinking_requested: false,
            }
          : {
              content: `Answer ${i}: done.`,
              reasoning_content: `Thinking about ${i}.`,
              finish_reason: 'stop',
              completion_tokens: 600,
              thinking_requested: true,
            };
        const variant = plain ? 1 : 0;
        q.completed(q.check(input, 'e1', variant), variant);
        const verdict = q.verdict(gate);
        if (verdict.overLimit) return { at: i, reason: verdict.reason };
      }
      return null;
    };
    expect(run(false)).toBeNull();
    // 10% of the run, all empty: the run's window is at 10%, the variant's at 100%.
    const broken = run(true);
    expect(broken?.reason).toMatch(/^quality gate: variant plain: 100% of the last \d+ samples flagged \(limit 20%\): empty_content 100%/);
  });
});

describe("the input's own fields", () => {
  it('come out as metadata, the fields regen reads left out', () => {
    const parsed = parseInputLine(
      JSON.stringify({ id: 7, messages: [{ role: 'user', content: 'hi' }], params: { temperature: 0 }, source: 'gsm8k', meta: { split: 'train', n: [1, 2] } }),
      1,
      { regenerate: null },
    );
    expect(parsed).toMatchObject({ ok: true, custom_id: '7', metadata: { source: 'gsm8k', meta: { split: 'train', n: [1, 2] } } });
    const none = parseInputLine(JSON.stringify({ custom_id: 'a', prompt: 'hi' }), 1, { regenerate: null });
    expect(none).toMatchObject({ ok: true, metadata: null });
    const sample = {
      customId: '7',
      request: JSON.stringify({ messages: [], metadata: { source: 'gsm8k' } }),
      finishReason: 'stop',
      promptTokens: 1,
      completionTokens: 1,
      reasoningTokens: 0,
      cachedTokens: 0,
      endpointId: 'e',
      latencyMs: 1,
      attempts: 1,
      serverFaults: 0,
      flags: 0,
      variant: 1,
      sampleIndex: 0,
    };
    const line = JSON.parse(outputLine(sample, { reasoning_content: null, content: 'x', model: 'm' }, ['think', 'plain']));
    expect(line).toMatchObject({ variant: 'plain', metadata: { source: 'gsm8k' } });
    const bare = JSON.parse(outputLine({ ...sample, request: '{"messages":[]}', variant: null }, { reasoning_content: null, content: 'x', model: 'm' }));
    expect('variant' in bare || 'metadata' in bare).toBe(false);
  });

  it(`are refused over ${MAX_METADATA_BYTES} bytes, with their own code`, () => {
    const big = { custom_id: 'big', prompt: 'hi', meta: 'x'.repeat(MAX_METADATA_BYTES) };
    expect(parseInputLine(JSON.stringify(big), 3, { regenerate: null })).toMatchObject({ ok: false, code: 'metadata_too_large', custom_id: 'big' });
    const fits = { custom_id: 'ok', prompt: 'hi', meta: 'x'.repeat(MAX_METADATA_BYTES - 100) };
    expect(parseInputLine(JSON.stringify(fits), 3, { regenerate: null })).toMatchObject({ ok: true });
  });
});

describe('on_length', () => {
  const attempt = (maxTokens: number | null, contextLength: number | null): Attempt => ({
    sampleId: 1,
    runId: 'r',
    shardIdx: 0,
    endpointId: 'e',
    attempts: 1,
    qualityRetries: 0,
    serverFaults: 0,
    thinking: true,
    cancelled: false,
    quarantined: false,
    variant: null,
    maxTokens,
    contextLength,
    conversation: null,
  });
  const cut: Answer = {
    content: 'partial',
    reasoning: 'partial',
    toolCalls: null,
    finishReason: 'length',
    logprobs: null,
    usage: { prompt_tokens: 100, completion_tokens: 256, reasoning_tokens: 200, cached_tokens: 0 },
    model: 'm',
    responseId: undefined,
    created: undefined,
  };
  const run = (onLength: string) => ({ model: 'm', quality: null, onLength });

  it('doubles max_tokens up to what the context leaves after the prompt, then has no more room', () => {
    expect(nextMaxTokens(256, 100, 4096)).toBe(512);
    // SGLang refuses prompt + max_tokens >= context.
    expect(nextMaxTokens(3000, 100, 4096)).toBe(3995);
    expect(nextMaxTokens(3995, 100, 4096)).toBeNull();
    expect(nextMaxTokens(null, 100, 4096)).toBeNull();
    expect(nextMaxTokens(256, 100, null)).toBe(512);
  });

  it('keeps a cut answer under keep, retries it with more room under retry, fails it under fail', () => {
    expect(settleAnswer(attempt(256, 4096), run('keep'), cut, 1, 0, flagBit('truncated')).outcome.kind).toBe('completed');
    const retried = settleAnswer(attempt(256, 4096), run('retry'), cut, 1, 0, flagBit('truncated'));
    expect(retried).toMatchObject({ retried: 'length', outcome: { kind: 'retry', maxTokens: 512, usage: cut.usage } });
    expect(settleAnswer(attempt(3995, 4096), run('retry'), cut, 1, 0, 0).outcome).toMatchObject({ kind: 'failed', error: { code: 'length_exhausted' } });
    expect(settleAnswer(attempt(256, 4096), run('fail'), cut, 1, 0, 0).outcome).toMatchObject({ kind: 'failed', error: { code: 'truncated' } });
    // A choice of a request with n > 1 carries no prompt tokens of its own: the request's are used.
    const sibling = { ...cut, usage: { ...cut.usage, prompt_tokens: 0 } };
    expect(settleAnswer({ ...attempt(3000, 4096), requestPromptTokens: 100 }, run('retry'), sibling, 1, 0, 0).outcome).toMatchObject({
      kind: 'retry',
      maxTokens: 3995,
    });
    // An answer that stopped on its own is kept whatever on_length says.
    expect(settleAnswer(attempt(256, 4096), run('fail'), { ...cut, finishReason: 'stop' }, 1, 0, 0).outcome.kind).toBe('completed');
  });
});

describe('the forecast of a run with variants', () => {
  // 70% thinking answers of 1,000 tokens, 30% plain ones of 10: 703 tokens a sample on average.
  // A slice that by chance holds half of each would say 505.
  const slice = Array.from({ length: 100 }, (_, i) => [i * 100, i % 2 ? 10 : 1000, i % 2] as const);
  const input: ForecastInput = {
    whole: true,
    total: 10_000,
    remaining: 10_000,
    completionTokens: 0,
    slice,
    sliceOpen: 0,
    frontier: -1,
    tokensPerSecond: 1000,
    endpoints: 1,
    elapsedSeconds: 0,
    deadlineSeconds: null,
    now: 0,
  };

  it('weights each variant’s mean length by its share, not by its luck in the slice', () => {
    expect(variantMean(slice, [0.7, 0.3])).toBeCloseTo(703);
    const weighted = computeForecast({ ...input, variantShares: [0.7, 0.3] }, seededRandom('v'))!;
    expect(weighted.completion_tokens_estimate).toBe(7_030_000);
    expect(weighted.low!).toBeLessThan(weighted.wall_seconds_remaining!);
    expect(weighted.high!).toBeGreaterThan(weighted.wall_seconds_remaining!);
    // Without the shares, the slice's own mix.
    expect(computeForecast(input, seededRandom('v'))!.completion_tokens_estimate).toBe(5_050_000);
    // A variant with no slice answer ahead takes the mean of all.
    expect(variantMean([[0, 100, 0]], [0.5, 0.5])).toBe(100);
  });
});
