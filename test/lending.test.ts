import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { makeLogger } from '../src/logger.js';
import { startServer } from '../src/server.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { createRun, listAllSamples, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';
import { call, tempDir, waitFor } from './support/server.js';
import { storeEnv } from './support/store.js';

// Handing servers back on time (README "Sharing servers"): past lend_until or outside its
// schedule an endpoint gets nothing new and no generating probe, the run goes on elsewhere, and a
// window opening again resumes it.

const ENDED = ['completed', 'failed', 'cancelled'];
/** Each answer takes about 0.2 s (40 tokens at 200 a second) and each endpoint runs two: a run of a hundred lasts long enough to watch. */
const SIM = { 'completion-tokens': 40, 'reasoning-tokens': 0, 'tokens-per-second': 200, 'max-running': 8 };
const CAP = 2;
const MINUTE_MS = 60_000;
/**
 * How far ahead of the server's clock a lend ends or a window opens: past any set-up a loaded
 * machine takes (minutes at a load of 40 on 2 cores), so only the test's jump reaches it.
 */
const LEAD_MS = 10 * MINUTE_MS;
/** Longer than any jump: the replica's own heartbeat must not look stale after one. */
const STALE_MS = 60 * MINUTE_MS;
/**
 * Answers of the other endpoint watched before the window opens: at two slots of 0.2 s, about 3 s
 * off schedule, some fifteen of the server's probe intervals (REGEN_PROBE_INTERVAL_MS 200), long
 * enough for a stray request or /health probe to show, with most of the run left for the window.
 */
const WATCHED_OFF_SCHEDULE = 30;

// The two tests run at once (`describe.concurrent` below), each on simulators and a server of its
// own: most of each is waiting on simulated answers. So what they start is stopped after both.
const sims: SimProcess[] = [];
const cleanups: (() => Promise<void>)[] = [];
afterAll(async () => {
  for (const c of cleanups.splice(0)) await c();
  await Promise.all(sims.splice(0).map((s) => s.stop()));
});

async function twoSims(): Promise<[SimProcess, SimProcess]> {
  const pair = await Promise.all([41, 42].map((seed) => spawnSimulator({ ...SIM, seed })));
  sims.push(...pair);
  return [pair[0], pair[1]];
}

/**
 * A server whose runner reads a clock the test moves on: a lend ends, or a window opens, the
 * moment the test has seen what it must see before it, however long that took on a loaded machine,
 * and without waiting out the time in between. The replica's heartbeat must not take a jump for a
 * stalled process.
 */
async function clockedServer(): Promise<{ base: string; now: () => number; jumpTo: (t: number) => void }> {
  const { dir: dataDir, cleanup } = tempDir('regen-lending-');
  let offset = 0;
  const now = () => Date.now() + offset;
  const config = loadConfig(
    {
      ...(await storeEnv(dataDir)),
      REGEN_LOG_LEVEL: 'silent',
      REGEN_PROBE_INTERVAL_MS: '200',
      REGEN_RUNNER_THREAD: 'false',
      REGEN_REPLICA_STALE_MS: String(STALE_MS),
    },
    { data: dataDir, port: '0' },
  );
  const server = await startServer(config, { logger: makeLogger('silent'), clock: now });
  cleanups.push(async () => {
    await server.close(2000);
    cleanup();
  });
  return { base: server.url, now, jumpTo: (t) => (offset += t - now()) };
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

describe.concurrent('handing servers back', () => {
  describe('lend_until', () => {
    it('after it the endpoint gets no new request, what ran there finishes, and the run completes on the others', { timeout: 300_000 }, async () => {
      const [lent, kept] = await twoSims();
      const { base, now, jumpTo } = await clockedServer();
      // Ended by a jump once the lent endpoint is at work.
      const until = now() + LEAD_MS;
      const a = await registerEndpoint(base, lent.url, { max_concurrency: CAP, lend_until: new Date(until).toISOString() });
      await registerEndpoint(base, kept.url, { max_concurrency: CAP });
      // Two endpoints at two slots of 0.2 s make 20 a second, and the kept one alone 10: a few
      // seconds' work is left to it after the lend.
      const n = 100;
      const runId = await start(base, n, 'lend');
      await waitFor('the lent endpoint at work', async () => ((await lent.stats()).requests > 0 ? true : undefined), 60_000, 50);
      jumpTo(until);
      // Past the lend, what runs there drains and nothing more is sent.
      const drained = await waitFor(
        'the lend over and the endpoint drained',
        async () => {
          const e = (await call(base, `/v1/endpoints/${a.id}`)).body;
          return e.off_schedule && e.in_flight === 0 ? e : undefined;
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
      const { base, now, jumpTo } = await clockedServer();
      const hhmm = (t: number) => new Date(t).toISOString().slice(11, 16);
      const window = (start: number) => [{ from: hhmm(start), to: hhmm(start + 2 * MINUTE_MS) }];
      const later = now() + 12 * 60 * MINUTE_MS;
      const e = await registerEndpoint(base, scheduled.url, { max_concurrency: CAP, schedule: window(later), timezone: 'UTC' });
      expect(e.off_schedule).toBe(true);
      expect(e.next_window_at).toBe(new Date(Math.floor(later / MINUTE_MS) * MINUTE_MS).toISOString());
      await registerEndpoint(base, always.url, { max_concurrency: CAP });
      // Probed by /v1/models alone while off schedule: ready, yet untouched.
      await waitFor('the scheduled endpoint ready', async () => ((await call(base, `/v1/endpoints/${e.id}`)).body.state === 'ready' ? true : undefined));
      const n = 100;
      const runId = await start(base, n, 'window');
      // A whole minute, and the clock stays short of it until the run is under way.
      const windowStart = Math.ceil((now() + LEAD_MS) / MINUTE_MS) * MINUTE_MS;
      const patched = await call(base, `/v1/endpoints/${e.id}`, { method: 'PATCH', json: { schedule: window(windowStart) } });
      expect(patched.body.next_window_at).toBe(new Date(windowStart).toISOString());
      // Every look while the run is dispatched on the other endpoint, before the window, finds this one
      // untouched: no request, no generating probe.
      const early: number[] = [];
      await waitFor(
        'the run under way on the other endpoint',
        async () => {
          const stats = await scheduled.stats();
          early.push(stats.requests + stats.healthChecks);
          return (await always.stats()).completed >= WATCHED_OFF_SCHEDULE ? true : undefined;
        },
        60_000,
        50,
      );
      expect(now()).toBeLessThan(windowStart);
      expect(early.filter((x) => x !== 0)).toEqual([]);
      jumpTo(windowStart);
      await waitFor('the window open and the endpoint at work', async () => ((await scheduled.stats()).requests > 0 ? true : undefined), 60_000, 50);
      await expectAllCompleted(base, runId, n);
      expect((await scheduled.stats()).completed).toBeGreaterThan(0);
    });
  });
});
