import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { QUALITY_WINDOW } from '../src/domain/quality-window.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer } from './support/server.js';
import { createRun, listAllSamples, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// Loops stopped while they run, against simulator processes: a "[loop]" prompt makes the
// simulator repeat one phrase until max_tokens, and it counts the tokens it generated for each
// request its client hung up on. Each scenario has its own model name, so its runs reach only
// its own simulator.

const TERMINAL = ['completed', 'failed', 'cancelled', 'paused'];
const THINKING = { chat_template_kwargs: { enable_thinking: true } };
// A loop left alone runs this long: 20 s of decode a request at the simulator's speed.
const MAX_TOKENS = 20_000;
// Where a loop must have been cut: the watch needs four repeats over 300 characters and two checks
// 256 characters apart (about 200 tokens), plus what the server sent while the abort travelled.
const CUT_WITHIN_TOKENS = 1000;
const LOOP_EVERY = 20;
// Healthy answers of 4,000 tokens, two waves of the simulator's 64 slots: 512k streamed events in all.
const LONG_RUN = 128;

let server: Awaited<ReturnType<typeof startTestServer>>;
const sims: SimProcess[] = [];

async function sim(flags: Record<string, string | number>): Promise<SimProcess> {
  const s = await spawnSimulator({ 'ttft-ms': 20, 'tokens-per-second': 4000, 'max-running': 64, ...flags });
  sims.push(s);
  return s;
}

/** `n` prompts, one in LOOP_EVERY of them asking the simulator to loop. */
function prompts(n: number, tag: string): { jsonl: string; loops: Set<string> } {
  const loops = new Set<string>();
  const lines: string[] = [];
  for (let i = 0; i < n; i++) {
    const id = `${tag}-${i}`;
    const loop = i % LOOP_EVERY === 7;
    if (loop) loops.add(id);
    lines.push(JSON.stringify({ custom_id: id, messages: [{ role: 'user', content: `Question ${i} of ${tag}${loop ? ' [loop]' : ''}` }] }));
  }
  return { jsonl: `${lines.join('\n')}\n`, loops };
}

async function run(model: string, n: number, tag: string, extra: Record<string, unknown> = {}) {
  const p = prompts(n, tag);
  const fileId = await uploadFile(server.url, p.jsonl);
  const created = await createRun(server.url, { model, input: { file_id: fileId }, shard_size: 500, ...extra });
  return { id: created.id as string, loops: p.loops };
}

beforeAll(async () => {
  server = await startTestServer();
});

afterAll(async () => {
  await server?.cleanup();
  await Promise.all(sims.map((s) => s.stop()));
});

describe('stopping loops while they run', () => {
  it('cuts each loop within a bounded number of tokens, flags it repetitive and asks it again', async () => {
    // A decode speed near a real server's, so that what a cut costs in tokens is the watch's doing, not
    // the test machine's load: at 400 tokens/s the bound leaves the watch 2 s to hang up once it has
    // seen the loop (at 1,000, a machine at load 13 overran it by 600 tokens).
    const s = await sim({ model: 'l-loop', 'completion-tokens': 200, 'reasoning-tokens': 300, 'tokens-per-second': 400, 'max-running': 64, seed: 21 });
    const ep = await registerEndpoint(server.url, s.url);
    // Past the quality window (400), so the endpoints' figures show it cut to the window.
    const n = 480;
    const { id, loops } = await run('l-loop', n, 'loop', { params: { ...THINKING, max_tokens: MAX_TOKENS } });
    const done = await waitForStatus(server.url, id, TERMINAL, 120_000);
    expect(done.status, done.status_reason).toBe('completed');

    const stats = await s.stats();
    // Every request was streamed; every loop was asked twice (retry_flagged 1) and cut both times, early.
    expect(stats.streamed).toBe(stats.requests);
    expect(stats.requests).toBe(n + loops.size);
    expect(stats.aborted).toBe(2 * loops.size);
    expect(stats.maxTokensBeforeHangUp).toBeGreaterThan(0);
    expect(stats.maxTokensBeforeHangUp).toBeLessThanOrEqual(CUT_WITHIN_TOKENS);

    const samples = await listAllSamples(server.url, id);
    for (const x of samples) {
      expect(x.status).toBe('completed');
      if (loops.has(x.custom_id)) {
        expect(x.flags, x.custom_id).toEqual(['repetitive']);
        expect(x.finish_reason).toBe('abort');
      } else {
        expect(x.flags, x.custom_id).toEqual([]);
        expect(x.finish_reason).toBe('stop');
      }
    }

    const quality = (await call(server.url, `/v1/runs/${id}/quality`)).body;
    expect(quality.settings.stop_loops).toBe(true);
    expect(quality.loops.enabled).toBe(true);
    expect(quality.loops.stopped).toBe(2 * loops.size);
    // Each cut spared its budget less what had been streamed, which the simulator bounds from above.
    expect(quality.loops.tokens_saved).toBeGreaterThanOrEqual(2 * loops.size * (MAX_TOKENS - CUT_WITHIN_TOKENS));
    expect(quality.loops.tokens_saved).toBeLessThan(2 * loops.size * MAX_TOKENS);
    expect(quality.by_flag.repetitive.count).toBe(loops.size);
    expect(quality.endpoints).toEqual([
      { endpoint_id: ep.id, samples: Math.min(n, QUALITY_WINDOW), flagged: expect.any(Number), share: expect.any(Number), top_flag: 'repetitive' },
    ]);
    expect(quality.endpoints[0].share).toBeCloseTo(1 / LOOP_EVERY, 1);

    const metrics = (await call(server.url, '/metrics')).body as unknown as string;
    expect(metrics).toContain(`regen_loops_stopped_total{run_id="${id}",model="l-loop"} ${2 * loops.size}`);
    expect(metrics).toContain(`regen_loop_tokens_saved_total{run_id="${id}",model="l-loop"} ${quality.loops.tokens_saved}`);
    console.log(
      `stop loops: ${JSON.stringify({ loops: loops.size, cut: quality.loops.stopped, most_tokens_before_a_cut: stats.maxTokensBeforeHangUp, tokens_saved: quality.loops.tokens_saved })}`,
    );
  });

  it('never cuts a healthy long answer', async () => {
    const s = await sim({ model: 'l-long', 'completion-tokens': 1000, 'reasoning-tokens': 3000, 'tokens-per-second': 20_000, seed: 22 });
    await registerEndpoint(server.url, s.url);
    const fileId = await uploadFile(
      server.url,
      `${Array.from({ length: LONG_RUN }, (_, i) => JSON.stringify({ custom_id: `long-${i}`, messages: [{ role: 'user', content: `Long question ${i}` }] })).join('\n')}\n`,
    );
    const created = await createRun(server.url, { model: 'l-long', input: { file_id: fileId }, params: { ...THINKING, max_tokens: MAX_TOKENS } });
    const done = await waitForStatus(server.url, created.id, TERMINAL, 120_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.quality.flagged).toBe(0);
    const stats = await s.stats();
    expect(stats.streamed).toBe(LONG_RUN);
    expect(stats.aborted).toBe(0);
    expect(stats.completed).toBe(LONG_RUN);
    const quality = (await call(server.url, `/v1/runs/${created.id}/quality`)).body;
    expect(quality.loops).toEqual({ enabled: true, stopped: 0, tokens_saved: 0 });
  });

  it('keeps the buffered request when stop_loops is off: a loop then runs to max_tokens', async () => {
    const s = await sim({ model: 'l-off', 'completion-tokens': 50, 'reasoning-tokens': 50, seed: 23 });
    await registerEndpoint(server.url, s.url);
    const { id, loops } = await run('l-off', 100, 'off', { params: { ...THINKING, max_tokens: 2000 }, quality: { stop_loops: false, retry_flagged: 0 } });
    const done = await waitForStatus(server.url, id, TERMINAL, 120_000);
    expect(done.status, done.status_reason).toBe('completed');
    const stats = await s.stats();
    expect(stats.streamed).toBe(0);
    expect(stats.aborted).toBe(0);
    const samples = await listAllSamples(server.url, id);
    for (const x of samples.filter((y) => loops.has(y.custom_id))) {
      expect(x.flags).toEqual(expect.arrayContaining(['repetitive', 'truncated']));
      expect(x.usage.completion_tokens).toBe(2000);
    }
    const quality = (await call(server.url, `/v1/runs/${id}/quality`)).body;
    expect(quality.loops).toEqual({ enabled: false, stopped: 0, tokens_saved: 0 });
  });
});
