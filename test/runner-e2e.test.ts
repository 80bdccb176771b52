import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { serverCeiling } from '../src/runner/capacity.js';
import { Stores } from '../src/storage/index.js';
import { call, startTestServer } from './support/server.js';
import { checkOutput, createRun, expectCountersMatchRecount, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

const MODEL = 'qwen3-sim';
const SAMPLES = 3000;
const SHARD_SIZE = 500;
// ~40 ms to the first token plus 96 tokens at 1000/s: each request takes ~140 ms.
const LATENCY = { 'ttft-ms': 40, 'tokens-per-second': 1000, model: MODEL };
/** Longer than the test: the late server's start-up ends when the test sets it to 0. */
const LOADING_UNTIL_RELEASED_MS = 3_600_000;

let server: Awaited<ReturnType<typeof startTestServer>>;
const sims: SimProcess[] = [];

beforeAll(async () => {
  sims.push(await spawnSimulator({ ...LATENCY, 'max-running': 8, seed: 1 }));
  sims.push(await spawnSimulator({ ...LATENCY, 'max-running': 16, seed: 2 }));
  server = await startTestServer();
  // Loading its weights until the test lets it finish: it must still be `starting` when the run
  // begins, however long a loaded machine takes to get there.
  sims.push(await spawnSimulator({ ...LATENCY, 'max-running': 4, 'startup-ms': LOADING_UNTIL_RELEASED_MS, seed: 3 }));
});

afterAll(async () => {
  await server?.cleanup();
  await Promise.all(sims.map((s) => s.stop()));
});

describe('a run across three simulators', () => {
  it('answers every prompt exactly once, fills every endpoint to its cap, and writes a consistent manifest', async () => {
    const base = server.url;
    const [a, b, late] = sims;
    const eps = [];
    for (const s of [late, a, b]) eps.push(await registerEndpoint(base, s.url));
    for (const e of eps) expect(e.state).toBe('starting');

    const prompts = makePrompts(SAMPLES);
    const fileId = await uploadFile(base, prompts.jsonl);
    const created = await createRun(base, {
      name: 'e2e',
      model: MODEL,
      input: { file_id: fileId },
      shard_size: SHARD_SIZE,
      regenerate: 'last_assistant',
      params: { temperature: 0.6, max_tokens: 4096 },
    });
    expect(created.status).toBe('validating');

    // The run gets going on the two fast servers while the third still answers 503.
    const running = await waitForStatus(base, created.id, ['in_progress', 'finalizing', 'completed']);
    expect(running.status).not.toBe('completed');
    const lateWhileRunning = (await call(base, `/v1/endpoints/${eps[0].id}`)).body;
    expect(lateWhileRunning.state).toBe('starting');
    expect((await late.stats()).requests).toBe(0);
    await late.configure({ startupMs: 0 });

    const done = await waitForStatus(base, created.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status, JSON.stringify(done.status_reason)).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, pending: 0, in_progress: 0, failed: 0, cancelled: 0 });
    expect(done.shards).toEqual({ total: SAMPLES / SHARD_SIZE, uploaded: SAMPLES / SHARD_SIZE });
    expect(done.manifest_uri).toBe(`${done.output_uri}manifest.json`);

    // The output folder, read as a user would.
    const stores = new Stores({ forcePathStyle: false });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(SAMPLES);
    expect(out.errors.size).toBe(0);
    expect([...prompts.expected.keys()].every((id) => out.lines.has(id))).toBe(true);
    expect(out.manifest.run).toMatchObject({ id: done.id, status: 'completed', model: MODEL });
    expect(out.manifest.counts).toEqual({ total: SAMPLES, completed: SAMPLES, failed: 0, cancelled: 0 });
    expect(out.manifest.shards).toHaveLength(SAMPLES / SHARD_SIZE);
    expect(out.manifest.shards.every((s: any) => s.lines === SHARD_SIZE && s.errors_key === null)).toBe(true);
    const usage = [...out.lines.values()].reduce((t, l) => t + l.usage.completion_tokens, 0);
    expect(out.manifest.usage.completion_tokens).toBe(usage);
    expect(done.usage.completion_tokens).toBe(usage);
    const line = out.lines.get('p-7');
    expect(line).toMatchObject({ model: MODEL, finish_reason: 'stop', attempts: 1, flags: [] });
    expect(line.reasoning_content.length).toBeGreaterThan(0);
    expect(fileURLToPath(done.output_uri)).toContain(done.id);

    // Every server was kept full, with at most a short queue behind what it runs (its cap is
    // adaptive: what it can run plus the low end of its queue band), and the late one took its
    // share once it was up.
    const perEndpoint = new Map<string, number>();
    for (const l of out.lines.values()) perEndpoint.set(l.endpoint_id, (perEndpoint.get(l.endpoint_id) ?? 0) + 1);
    for (const [sim, cap, ep] of [
      [late, 4, eps[0]],
      [a, 8, eps[1]],
      [b, 16, eps[2]],
    ] as const) {
      const stats = await sim.stats();
      expect(stats.maxRunningSeen, `${sim.url} max running`).toBe(cap);
      expect(stats.rejected).toBe(0);
      expect(stats.completed).toBe(perEndpoint.get(ep.id));
      const row = (await call(base, `/v1/endpoints/${ep.id}`)).body;
      expect(row).toMatchObject({ state: 'ready', model: MODEL, max_concurrency_source: 'adaptive', in_flight: 0, capacity: { max_running: cap } });
      expect(row.max_concurrency).toBeGreaterThanOrEqual(cap);
      expect(row.max_concurrency).toBeLessThanOrEqual(serverCeiling(cap));
      expect(row.stats.completed).toBe(perEndpoint.get(ep.id));
    }

    const all = await expectCountersMatchRecount(base, done);
    expect(all.every((s) => s.status === 'completed' && s.attempts === 1 && s.output_line > 0)).toBe(true);
    const sample = (await call(base, `/v1/runs/${done.id}/samples/p-7`)).body;
    expect(sample.output.content).toBe(line.content);
    stores.close();
  });
});
