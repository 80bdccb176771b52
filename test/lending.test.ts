import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { makeLogger } from '../src/logger.js';
import { startServer, type Server } from '../src/server.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { createRun, listAllSamples, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';
import { call, startTestServer, tempDir, waitFor } from './support/server.js';
import { storeEnv } from './support/store.js';

// Handing servers back on time (README "Sharing servers"): past lend_until or outside its
// schedule an endpoint gets nothing new and no generating probe, the run goes on elsewhere, and a
// window opening again resumes it.

const ENDED = ['completed', 'failed', 'cancelled'];
/** Each answer takes about 0.2 s (40 tokens at 200 a second) and each endpoint runs two: a run of hundreds lasts long enough to watch. */
const SIM = { 'completion-tokens': 40, 'reasoning-tokens': 0, 'tokens-per-second': 200, 'max-running': 8 };
const CAP = 2;
const LEND_MS = 15_000;
const MINUTE_MS = 60_000;

const sims: SimProcess[] = [];
const cleanups: (() => Promise<void>)[] = [];
const tmp = tempDir('regen-lending-');
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
  await Promise.all(sims.splice(0).map((s) => s.stop()));
});
afterAll(() => tmp.cleanup());

async function twoSims(): Promise<[SimProcess, SimProcess]> {
  for (const seed of [41, 42]) sims.push(await spawnSimulator({ ...SIM, seed }));
  return [sims[0], sims[1]];
}

async function start(base: string, n: number, tag: string): Promise<string> {
  const prompts = makePrompts(n, tag);
  const run = await createRun(base, {
    model: 'sim-model',
    input: { file_id: await uploadFile(base, prompts.jsonl) },
    regenerate: 'last_assistant',
    quality: false,
  });
  return run.id;
}

async function expectAllCompleted(base: string, runId: string, n: number): Promise<void> {
  expect((await waitForStatus(base, runId, ENDED, 240_000)).status).toBe('completed');
  const samples = await listAllSamples(base, runId);
  expect(samples.filter((s) => s.status !== 'completed')).toEqual([]);
  expect(samples).toHaveLength(n);
}

describe('lend_until', () => {
  it('after it the endpoint gets no new request, what ran there finishes, and the run completes on the others', { timeout: 300_000 }, async () => {
    const [lent, kept] = await twoSims();
    const server = await startTestServer();
    cleanups.push(() => server.cleanup());
    const base = server.url;
    const until = Date.now() + LEND_MS;
    const a = await registerEndpoint(base, lent.url, { max_concurrency: CAP, lend_until: new Date(until).toISOString() });
    await registerEndpoint(base, kept.url, { max_concurrency: CAP });
    // Two endpoints at two slots of 0.2 s make 20 a second: 300 within the lend at best, the rest after it.
    const n = 400;
    const runId = await start(base, n, 'lend');
    await waitFor('the lent endpoint at work', async () => ((await lent.stats()).requests > 0 ? true : undefined), 60_000, 50);
    // Past the lend, what runs there drains and nothing more is sent.
    const drained = await waitFor(
      'the lend over and the endpoint drained',
      async () => {
        const e = (await call(base, `/v1/endpoints/${a.id}`)).body;
        return Date.now() >= until && e.off_schedule && e.in_flight === 0 ? e : undefined;
      },
      60_000,
      50,
    );
    expect(drained.next_window_at).toBeNull();
    const sentBefore = (await lent.stats()).requests;
    const run = (await call(base, `/v1/runs/${runId}`)).body;
    expect(run.request_counts.completed, 'the run outlasts the lend').toBeLessThan(n);
    await expectAllCompleted(base, runId, n);
    expect((await lent.stats()).requests).toBe(sentBefore);
    expect((await kept.stats()).completed).toBe(n - sentBefore);
  });
});

describe('a schedule window', () => {
  it('off schedule the endpoint gets nothing and no /health probe; its window opening resumes it', { timeout: 300_000 }, async () => {
    const [scheduled, always] = await twoSims();
    // The runner reads an injected clock, moved on to eight seconds before a window opens once all
    // is set up: the window opens without a minute's wait, however long the set-up took. The
    // replica's heartbeat must not take the jump for a stalled process.
    let offset = 0;
    const now = () => Date.now() + offset;
    const hhmm = (t: number) => new Date(t).toISOString().slice(11, 16);
    const window = (start: number) => [{ from: hhmm(start), to: hhmm(start + 2 * MINUTE_MS) }];
    const config = loadConfig(
      {
        ...(await storeEnv(tmp.dir)),
        REGEN_LOG_LEVEL: 'silent',
        REGEN_PROBE_INTERVAL_MS: '200',
        REGEN_RUNNER_THREAD: 'false',
        REGEN_REPLICA_STALE_MS: String(10 * MINUTE_MS),
      },
      { data: tmp.dir, port: '0' },
    );
    const server: Server = await startServer(config, { logger: makeLogger('silent'), clock: now });
    cleanups.push(() => server.close(2000));
    const base = server.url;
    const later = now() + 12 * 60 * MINUTE_MS;
    const e = await registerEndpoint(base, scheduled.url, { max_concurrency: CAP, schedule: window(later), timezone: 'UTC' });
    expect(e.off_schedule).toBe(true);
    expect(e.next_window_at).toBe(new Date(Math.floor(later / MINUTE_MS) * MINUTE_MS).toISOString());
    await registerEndpoint(base, always.url, { max_concurrency: CAP });
    // Probed by /v1/models alone while off schedule: ready, yet untouched.
    await waitFor('the scheduled endpoint ready', async () => ((await call(base, `/v1/endpoints/${e.id}`)).body.state === 'ready' ? true : undefined));
    const n = 300;
    const runId = await start(base, n, 'window');
    const windowStart = Math.ceil(now() / MINUTE_MS) * MINUTE_MS + MINUTE_MS;
    offset += windowStart - 8000 - now();
    const patched = await call(base, `/v1/endpoints/${e.id}`, { method: 'PATCH', json: { schedule: window(windowStart) } });
    expect(patched.body.next_window_at).toBe(new Date(windowStart).toISOString());
    const early: number[] = [];
    await waitFor(
      'the window open and the endpoint at work',
      async () => {
        const at = now();
        const stats = await scheduled.stats();
        // Polls well before the window must all find it untouched: no request, no generating probe.
        if (at < windowStart - 200) early.push(stats.requests + stats.healthChecks);
        return stats.requests > 0 ? true : undefined;
      },
      60_000,
      50,
    );
    expect(early.length).toBeGreaterThan(0);
    expect(early.filter((x) => x !== 0)).toEqual([]);
    expect(now()).toBeGreaterThanOrEqual(windowStart);
    await expectAllCompleted(base, runId, n);
    expect((await scheduled.stats()).completed).toBeGreaterThan(0);
  });
});
