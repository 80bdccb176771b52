import { describe, expect, it } from 'vitest';
import { bitsFromFlags, flagBit, flagsFromBits } from '../../src/domain/flags.js';
import { gateTripped, type QualityInput } from '../../src/domain/quality.js';
import { explainVerdict, reasoningParser, RunQuality } from '../../src/domain/run-quality.js';
import { QualityWindow } from '../../src/domain/quality-window.js';
import { longReasoningAnswer, noParserAnswer, okAnswer, seeded, shortAnswer } from '../support/quality-samples.js';

// The run's quality as the runner will drive it: check() on every answer, completed() on every
// kept sample, verdict() with the gate's check. No retries here: each answer is kept.

const gate = { min_samples: 200, max_flag_rate: 0.2 };
const NEW_CHECKS = bitsFromFlags(['duplicate_content', 'think_in_content', 'short_for_run']);
const model = 'Qwen/Qwen3-8B';
const newRun = () => new RunQuality({ min_completion_tokens: 0, model });

/** Feeds answers to a run; the number of the answer (from 1) on which the run's gate first trips, or null. */
function feed(q: RunQuality, n: number, answer: () => QualityInput, endpoint = 'e1'): number | null {
  let tripped: number | null = null;
  for (let i = 1; i <= n; i++) {
    q.completed(q.check(answer(), endpoint));
    if (tripped === null && q.verdict(gate).overLimit) tripped = i;
  }
  return tripped;
}

describe('false flags on healthy runs', () => {
  const cases = [
    { name: '(a) long reasoning answers with varied text', answer: longReasoningAnswer },
    { name: '(b) short but distinct answers: numbers, cities, one sentence', answer: shortAnswer },
  ];
  for (const { name, answer } of cases) {
    it(`flags none of 10,000 samples of ${name}`, () => {
      const q = newRun();
      const random = seeded(name.length);
      let flaggedNew = 0;
      let flaggedAny = 0;
      for (let i = 0; i < 10_000; i++) {
        const flags = q.check(answer(random), `e${i % 3}`);
        q.completed(flags);
        if (flags & NEW_CHECKS) flaggedNew++;
        if (flags) flaggedAny++;
      }
      console.log(`${name}: new checks flagged ${flaggedNew} of 10000 (${(flaggedNew / 100).toFixed(2)}%), any flag ${flaggedAny}`);
      expect(flaggedNew).toBe(0);
      expect(flaggedAny).toBe(0);
      expect(q.verdict(gate)).toEqual({ overLimit: false, reason: null, quarantine: [] });
    });
  }
});

describe('a run that turns bad', () => {
  it('trips within 300 samples when "OK." comes from the start, without thinking', () => {
    const random = seeded(1);
    const q = newRun();
    const tripped = feed(q, 300, () => (random() < 0.87 ? okAnswer(random, false) : shortAnswer(random)));
    console.log(`87% "OK." from the start: tripped at sample ${tripped}`);
    expect(tripped).not.toBeNull();
    expect(tripped!).toBeLessThanOrEqual(300);
    const { reason } = q.verdict(gate);
    expect(reason).toMatch(/^quality gate: \d+% of the last 300 samples flagged \(limit 20%\): duplicate_content \d+%/);
    expect(reason).toMatch(/\d+% of recent answers are the same text 'OK\.'/);
    expect(gateTripped({ status: 'paused', statusReason: reason })).toBe(true);
  });

  const turns = [
    { healthy: 100_000, before: 'long reasoning', answer: longReasoningAnswer },
    { healthy: 2_000, before: 'long reasoning', answer: longReasoningAnswer },
    { healthy: 100_000, before: 'short distinct', answer: shortAnswer },
    { healthy: 2_000, before: 'short distinct', answer: shortAnswer },
  ];
  for (const { healthy, before, answer } of turns) {
    it(`trips within 300 bad samples after ${healthy} healthy ones (${before}), 87% "OK." without thinking`, () => {
      const random = seeded(healthy);
      const q = newRun();
      expect(feed(q, healthy, () => answer(random))).toBeNull();
      const tripped = feed(q, 300, () => (random() < 0.87 ? okAnswer(random, false) : answer(random)));
      console.log(`${healthy} healthy (${before}) then 87% "OK.": tripped after ${tripped} bad samples`);
      expect(tripped).not.toBeNull();
      expect(tripped!).toBeLessThanOrEqual(300);
      const { reason } = q.verdict(gate);
      if (before === 'long reasoning') expect(reason).toMatch(/answers are far shorter than the run's median \(median \d+ tokens\)/);
      else expect(reason).toMatch(/the same text 'OK\.'/);
    });
  }

  it('trips within 300 samples of the turn with a plain window of flags too: 100,000 healthy, then 87% flagged', () => {
    const w = new QualityWindow();
    const random = seeded(3);
    for (let i = 0; i < 100_000; i++) w.push(0);
    let tripped = 0;
    while (!w.overLimit(gate)) {
      w.push(random() < 0.87 ? flagBit('missing_reasoning') : 0);
      tripped++;
    }
    expect(tripped).toBeLessThanOrEqual(300);
  });
});

describe('one broken endpoint of five', () => {
  it('is picked within 200 of its samples while the run stays under its limit', () => {
    const random = seeded(5);
    const q = new RunQuality({ min_completion_tokens: 0, model });
    const endpoints = ['gpu-0', 'gpu-1', 'gpu-2', 'gpu-3', 'gpu-4'];
    let brokenSamples = 0;
    const run = new QualityWindow();
    let picked: ReturnType<RunQuality['verdict']>['quarantine'] = [];
    for (let i = 0; picked.length === 0 && brokenSamples < 400; i++) {
      const endpoint = endpoints[i % endpoints.length];
      const broken = endpoint === 'gpu-3';
      if (broken) brokenSamples++;
      const answer = broken && random() < 0.87 ? okAnswer(random, true) : longReasoningAnswer(random);
      const flags = q.check(answer, endpoint);
      q.completed(flags);
      run.push(flags);
      const v = q.verdict(gate);
      expect(v.overLimit).toBe(false);
      picked = v.quarantine;
    }
    console.log(`broken endpoint picked after ${brokenSamples} of its samples; run-wide share ${(100 * run.share).toFixed(1)}%`);
    expect(picked.map((p) => p.endpointId)).toEqual(['gpu-3']);
    expect(brokenSamples).toBeLessThanOrEqual(200);
    expect(run.share).toBeLessThan(0.2);
    expect(picked[0].flag).toBe('missing_reasoning');
    expect(picked[0].reason).toMatch(
      /^quality gate: endpoint gpu-3: \d+% of its last \d+ answers flagged against 0% on the other endpoints: missing_reasoning \d+%; thinking was asked for/,
    );
  });
});

describe('a server without a reasoning parser', () => {
  it('is named with the parser to launch it with', () => {
    const random = seeded(9);
    const q = newRun();
    const tripped = feed(q, 300, () => noParserAnswer(random));
    expect(tripped).toBe(gate.min_samples);
    const { reason } = q.verdict(gate);
    console.log(reason);
    expect(reason).toContain('think_in_content 100%');
    expect(reason).toMatch(
      /flagged \(limit 20%\): missing_reasoning 100%, think_in_content 100%; the server returns its thinking inside content: launch SGLang with --reasoning-parser qwen3;/,
    );
  });

  it('knows the parser of each family with think tags', () => {
    expect(reasoningParser('Qwen/Qwen3-235B-A22B')).toBe('qwen3');
    expect(reasoningParser('deepseek-ai/DeepSeek-R1-0528-Qwen3-8B')).toBe('deepseek-r1');
    expect(reasoningParser('deepseek-ai/DeepSeek-R1-0528')).toBe('deepseek-r1');
    expect(reasoningParser('deepseek-ai/DeepSeek-V3.1')).toBe('deepseek-v3');
    expect(reasoningParser('my-model')).toMatch(/qwen3, deepseek-r1/);
  });
});

describe('restore after a restart', () => {
  it('rebuilds the window, the endpoints and the lengths from the database rows', () => {
    const random = seeded(11);
    const live = newRun();
    const rows: { flags: number; endpointId: string; tokens: number }[] = [];
    for (let i = 0; i < 1000; i++) {
      const a = i >= 700 && i % 2 === 0 ? okAnswer(random, true) : longReasoningAnswer(random);
      const endpointId = i >= 700 && i % 2 === 0 ? 'bad' : `good-${i % 3}`;
      const flags = live.check(a, endpointId);
      live.completed(flags);
      rows.push({ flags, endpointId, tokens: a.completion_tokens });
    }
    const restored = newRun();
    const lengths = new Map<number, number>();
    for (const r of rows) lengths.set(r.tokens, (lengths.get(r.tokens) ?? 0) + 1);
    restored.restore(rows.slice(-400).reverse(), rows.length, lengths);
    const a = live.verdict(gate);
    const b = restored.verdict(gate);
    expect(b.overLimit).toBe(a.overLimit);
    // The same counts; only the sample of the duplicated text waits for new answers.
    expect(b.reason!.split(';')[0]).toBe(a.reason!.split(';')[0]);
    expect(b.quarantine.map((q) => q.endpointId)).toEqual(['bad']);
    // The lengths come back: an "OK." is short for this run straight away.
    expect(flagsFromBits(restored.check(okAnswer(random, false), 'good-0'))).toEqual(['short_for_run']);
  });
});

describe('explainVerdict', () => {
  it('names the flags by share and the cause of the commonest', () => {
    const w = new QualityWindow();
    for (let i = 0; i < 300; i++) w.push(i < 186 ? flagBit('duplicate_content') : i < 200 ? flagBit('truncated') : 0);
    const reason = explainVerdict({ window: w, gate, topContent: { text: 'OK.', count: 620, share: 0.62 }, medianTokens: 512, model });
    expect(reason).toBe(
      "quality gate: 67% of the last 300 samples flagged (limit 20%): duplicate_content 62%, truncated 5%; 62% of recent answers are the same text 'OK.'; answers stop at max_tokens (finish_reason length): raise max_tokens, or look for loops",
    );
  });
});

describe('cost', () => {
  it('checks 100,000 answers with the counter, the histogram and the windows in bounded time', () => {
    const random = seeded(13);
    const pool = Array.from({ length: 5000 }, () => longReasoningAnswer(random));
    const q = newRun();
    const start = performance.now();
    let flagged = 0;
    for (let i = 0; i < 100_000; i++) {
      const flags = q.check(pool[i % pool.length], `e${i % 4}`);
      q.completed(flags);
      if (flags) flagged++;
      if (i % 1000 === 0) q.verdict(gate);
    }
    const ms = performance.now() - start;
    console.log(`100,000 answers checked in ${ms.toFixed(0)} ms (${((1000 * ms) / 100_000).toFixed(1)} µs an answer)`);
    expect(flagged).toBe(0);
  });
});
