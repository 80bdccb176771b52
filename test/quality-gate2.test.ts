import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, waitFor } from './support/server.js';
import { createRun, getRun, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// Quality gate 2 against simulator processes: the "OK." disaster without thinking asked for, a late
// turn, a server without a reasoning parser, and healthy runs. Each scenario has its own model
// name, so its runs reach only its own simulators. These verdicts are made in the runner's memory
// as answers come in (RunQuality, the content counter, the quality window), so they run on one
// store; what the gate keeps in the store is in quality-gate2-persisted.test.ts.

const TERMINAL = ['completed', 'failed', 'cancelled', 'paused'];
const THINKING = { chat_template_kwargs: { enable_thinking: true } };
let server: Awaited<ReturnType<typeof startTestServer>>;
const sims: SimProcess[] = [];

async function sim(flags: Record<string, string | number>): Promise<SimProcess> {
  const s = await spawnSimulator({ 'ttft-ms': 20, 'tokens-per-second': 4000, 'max-running': 16, ...flags });
  sims.push(s);
  return s;
}

async function run(model: string, n: number, tag: string, extra: Record<string, unknown> = {}) {
  const prompts = makePrompts(n, tag);
  const fileId = await uploadFile(server.url, prompts.jsonl);
  const created = await createRun(server.url, { model, input: { file_id: fileId }, regenerate: 'last_assistant', shard_size: 500, ...extra });
  return { id: created.id as string, prompts };
}

beforeAll(async () => {
  server = await startTestServer();
});

afterAll(async () => {
  await server?.cleanup();
  await Promise.all(sims.map((s) => s.stop()));
});

describe('quality gate 2', () => {
  it('pauses the "OK." disaster without thinking asked for, within 300 completions, naming the text', async () => {
    const s = await sim({ model: 'g-ok', 'degenerate-rate': 0.87, seed: 3 });
    await registerEndpoint(server.url, s.url);
    const { id } = await run('g-ok', 3000, 'ok');
    const paused = await waitForStatus(server.url, id, TERMINAL, 90_000);
    expect(paused.status).toBe('paused');
    expect(paused.status_reason).toMatch(/^quality gate: /);
    expect(paused.status_reason).toContain('duplicate_content');
    expect(paused.status_reason).toContain('OK.');
    // Requests already in flight when it paused still finish and count.
    expect(paused.request_counts.completed).toBeLessThanOrEqual(300);
    console.log(`gate ok-disaster: ${JSON.stringify({ completed_at_pause: paused.request_counts.completed, reason: paused.status_reason })}`);
    expect((await call(server.url, `/v1/runs/${id}/cancel`, { method: 'POST' })).status).toBe(200);
  });

  it('pauses a run that turns bad after 2,000 healthy samples within 400 samples of the turn', async () => {
    // Answered at once until the turn, so the 2,000 healthy samples take only regen's own time; from
    // the turn on at the pace of the other scenarios, which is what the bound is counted at.
    const s = await sim({ model: 'g-turn', seed: 4, 'ttft-ms': 0, 'tokens-per-second': 0 });
    await registerEndpoint(server.url, s.url);
    const { id } = await run('g-turn', 6000, 'turn', { params: THINKING });
    await waitFor('2,000 healthy samples', async () => ((await getRun(server.url, id)).request_counts.completed >= 2000 ? true : undefined), 90_000, 20);
    await s.configure({ degenerateRate: 0.87, ttftMs: 20, tokensPerSecond: 4000 });
    // Counted once the server has turned: what finished meanwhile is healthy and not held against the bound.
    const turnedAt = (await getRun(server.url, id)).request_counts.completed;
    const paused = await waitForStatus(server.url, id, TERMINAL, 90_000);
    expect(paused.status).toBe('paused');
    expect(paused.status_reason).toMatch(/^quality gate: \d+% of the last \d+ samples flagged/);
    const after = paused.request_counts.completed - turnedAt;
    expect(after).toBeLessThanOrEqual(400);
    console.log(`gate late turn: ${JSON.stringify({ healthy: turnedAt, samples_after_the_turn: after })}`);
    expect((await call(server.url, `/v1/runs/${id}/cancel`, { method: 'POST' })).status).toBe(200);
  });

  it('says the thinking is in content when the server has no reasoning parser', async () => {
    const s = await sim({ model: 'g-parser', 'reasoning-parser': 0, seed: 6 });
    await registerEndpoint(server.url, s.url);
    const { id } = await run('g-parser', 1500, 'parser', { params: THINKING });
    const paused = await waitForStatus(server.url, id, TERMINAL, 90_000);
    expect(paused.status).toBe('paused');
    expect(paused.status_reason).toContain('think_in_content');
    expect(paused.status_reason).toContain('--reasoning-parser');
    expect((await call(server.url, `/v1/runs/${id}/cancel`, { method: 'POST' })).status).toBe(200);
  });

  it('flags nothing on healthy runs: long reasoning, and short distinct answers', async () => {
    const long = await sim({ model: 'g-long', 'completion-tokens': 400, 'reasoning-tokens': 300, seed: 7, 'max-running': 32 });
    const short = await sim({ model: 'g-short', 'completion-tokens': 6, 'reasoning-tokens': 0, seed: 8 });
    await registerEndpoint(server.url, long.url);
    await registerEndpoint(server.url, short.url);
    // 1,200 long answers: past every window the gate judges a run by (1,024 answers for duplicates,
    // 400 for the flagged share), at a fraction of the streaming that 2,000 of 700 tokens cost.
    const a = await run('g-long', 1200, 'long', { params: THINKING });
    const b = await run('g-short', 2000, 'short', { params: { chat_template_kwargs: { enable_thinking: false } } });
    for (const r of [a, b]) {
      const done = await waitForStatus(server.url, r.id, TERMINAL, 120_000);
      expect(done.status, done.status_reason).toBe('completed');
      expect(done.quality.flagged).toBe(0);
    }
  });
});
