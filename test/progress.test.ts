import { afterAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import type { RunRow } from '../src/db/schema.js';
import { makeLogger } from '../src/logger.js';
import { renderProgress } from '../src/routes/runs/render.js';
import { LatencyRing, RateWindow } from '../src/runner/rates.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { startServer, type Server } from '../src/server.js';
import { call, tempDir } from './support/server.js';
import { createRun, registerEndpoint, waitForStatus } from './support/runner-checks.js';
import { storeEnv } from './support/store.js';

/** A clock that only moves when the test says so. */
function fakeClock(start: number) {
  let now = start;
  return { now: () => now, advance: (ms: number) => (now += ms), set: (ms: number) => (now = ms) };
}

// Far from the real time on purpose: a rate fed with Date.now() would not line up with it.
const T0 = Date.UTC(2031, 0, 1, 12, 0, 0);

describe('RateWindow', () => {
  it('reports nothing before the first completion', () => {
    expect(new RateWindow().rates(T0)).toEqual({ samples: 0, tokens: 0, turns: 0 });
  });

  it('divides by the time since the first completion while that is shorter than the window', () => {
    const w = new RateWindow(60);
    const clock = fakeClock(T0);
    for (let s = 0; s < 20; s++) {
      w.add(clock.now(), 4, 400, 12);
      clock.advance(1000);
    }
    // 80 samples (conversations, of 240 turns) in 20 seconds.
    expect(w.rates(clock.now())).toEqual({ samples: 4, tokens: 400, turns: 12 });
    // A burst in the very first second does not divide by zero.
    const first = new RateWindow(60);
    first.add(T0, 7, 70);
    expect(first.rates(T0 + 300)).toEqual({ samples: 7, tokens: 70, turns: 0 });
  });

  it('forgets what is older than the window, so a slowdown shows within a minute', () => {
    const w = new RateWindow(60);
    const clock = fakeClock(T0);
    for (let s = 0; s < 120; s++) {
      w.add(clock.now(), 10, 1000);
      clock.advance(1000);
    }
    expect(w.rates(clock.now()).samples).toBeCloseTo(10 * (59 / 60), 5);
    for (let s = 0; s < 60; s++) {
      w.add(clock.now(), 2, 100);
      clock.advance(1000);
    }
    const r = w.rates(clock.now());
    expect(r.samples).toBeCloseTo(2 * (59 / 60), 5);
    expect(r.tokens).toBeCloseTo(100 * (59 / 60), 5);
  });

  it('falls to zero after a window without completions (a pause, a dead endpoint)', () => {
    const w = new RateWindow(60);
    w.add(T0, 50, 5000);
    expect(w.rates(T0 + 30_000).samples).toBeCloseTo(50 / 30, 5);
    expect(w.rates(T0 + 61_000)).toEqual({ samples: 0, tokens: 0, turns: 0 });
  });
});

describe('LatencyRing', () => {
  it('gives the median of the last N latencies', () => {
    const ring = new LatencyRing(5);
    expect(ring.p50()).toBeNull();
    for (const ms of [10, 30, 20]) ring.add(ms);
    expect(ring.p50()).toBe(20);
    // Five more push the first three out.
    for (const ms of [500, 400, 300, 200, 100]) ring.add(ms);
    expect(ring.p50()).toBe(300);
  });
});

function run(over: Partial<RunRow>): RunRow {
  return {
    status: 'in_progress',
    total: 1000,
    pending: 0,
    inProgress: 0,
    completed: 0,
    failed: 0,
    cancelled: 0,
    startedAt: T0,
    finishedAt: null,
    params: {},
    ...over,
  } as RunRow;
}

describe('renderProgress', () => {
  it('estimates the time left from the window rate and the samples still to do', () => {
    const w = new RateWindow(60);
    const clock = fakeClock(T0);
    for (let s = 0; s < 30; s++) {
      w.add(clock.now(), 5, 250);
      clock.advance(1000);
    }
    const r = w.rates(clock.now());
    const p = renderProgress(
      run({ pending: 800, inProgress: 48, completed: 150, failed: 2 }),
      { samples_per_second: r.samples, completion_tokens_per_second: r.tokens, forecast: null },
      clock.now(),
    );
    expect(p).toEqual({
      fraction: 152 / 1000,
      samples_per_second: 5,
      completion_tokens_per_second: 250,
      turns_per_second: null,
      requests_per_second: null,
      // 848 samples left at 5 a second.
      eta_seconds: Math.ceil(848 / 5),
      elapsed_seconds: 30,
      in_flight: 0,
      samples_in_flight: 0,
      turned_away: 0,
      without_ids: [],
    });
  });

  it('has no ETA without a rate or while the run is paused, and 0 once nothing is left', () => {
    const live = { samples_per_second: 3, completion_tokens_per_second: 30, forecast: null };
    const none = { samples_per_second: 0, completion_tokens_per_second: 0, forecast: null };
    expect(renderProgress(run({ pending: 10 }), none, T0).eta_seconds).toBeNull();
    expect(renderProgress(run({ pending: 10, status: 'paused' }), live, T0)).toMatchObject({
      eta_seconds: null,
      samples_per_second: 0,
      completion_tokens_per_second: 0,
    });
    expect(renderProgress(run({ pending: 0, completed: 1000, status: 'finalizing' }), live, T0).eta_seconds).toBe(0);
    // A run still validating has no samples yet: nothing is known about its end.
    expect(renderProgress(run({ status: 'validating', total: 0, startedAt: null }), none, T0)).toEqual({
      fraction: 0,
      samples_per_second: 0,
      completion_tokens_per_second: 0,
      turns_per_second: null,
      requests_per_second: null,
      eta_seconds: null,
      elapsed_seconds: 0,
      in_flight: 0,
      samples_in_flight: 0,
      turned_away: 0,
      without_ids: [],
    });
  });

  it('stops the elapsed time at the finish', () => {
    const done = run({ status: 'completed', completed: 1000, finishedAt: T0 + 90_500 });
    expect(renderProgress(done, { samples_per_second: 0, completion_tokens_per_second: 0, forecast: null }, T0 + 3600_000).elapsed_seconds).toBe(91);
    expect(renderProgress(run({ pending: 5 }), { samples_per_second: 0, completion_tokens_per_second: 0, forecast: null }, T0 + 42_000).elapsed_seconds).toBe(
      42,
    );
  });
});

describe('the runner reads time from deps.clock', () => {
  const tmp = tempDir();
  let server: Server | undefined;
  let sim: SimProcess | undefined;

  afterAll(async () => {
    await server?.close(2000);
    await sim?.stop();
    tmp.cleanup();
  });

  it('computes run and endpoint rates, and elapsed time, on the injected clock', async () => {
    const clock = fakeClock(T0);
    sim = await spawnSimulator({ model: 'sim-progress', 'completion-tokens': 40, 'reasoning-tokens': 10 });
    // The clock is a function, so the runner shares this thread to read it.
    const config = loadConfig(
      { ...(await storeEnv(tmp.dir)), REGEN_LOG_LEVEL: 'silent', REGEN_PROBE_INTERVAL_MS: '200', REGEN_RUNNER_THREAD: 'false' },
      { data: tmp.dir, port: '0' },
    );
    server = await startServer(config, { logger: makeLogger('silent'), clock: clock.now });
    const base = server.url;
    const ep = await registerEndpoint(base, sim.url);
    const requests = Array.from({ length: 24 }, (_, i) => ({ custom_id: `c-${i}`, messages: [{ role: 'user', content: `q ${i}` }] }));
    const created = await createRun(base, { model: 'sim-progress', input: { requests }, shard_size: 8 });
    expect(created.created_at).toBe(new Date(T0).toISOString());

    const done = await waitForStatus(base, created.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    // The clock never moved, so the run took no time at all; finished, it has no rate any more.
    expect(done.progress).toEqual({
      fraction: 1,
      samples_per_second: 0,
      completion_tokens_per_second: 0,
      turns_per_second: null,
      requests_per_second: null,
      eta_seconds: 0,
      elapsed_seconds: 0,
      in_flight: 0,
      samples_in_flight: 0,
      turned_away: 0,
      without_ids: [],
    });
    expect(done.usage.completion_tokens).toBeGreaterThan(0);
    expect(done.started_at).toBe(new Date(T0).toISOString());
    expect(done.finished_at).toBe(new Date(T0).toISOString());
    // Every completion landed in one second of the endpoint's window, which is divided by its
    // minimum span of one second; as the clock moves on, the window stretches and then empties.
    const endpoint = (await call(base, `/v1/endpoints/${ep.id}`)).body;
    expect(endpoint.stats.samples_per_second).toBe(24);
    expect(endpoint.stats.completion_tokens_per_second).toBe(done.usage.completion_tokens);

    clock.advance(30_000);
    expect((await call(base, `/v1/endpoints/${ep.id}`)).body.stats.samples_per_second).toBe(Math.round((24 / 30) * 100) / 100);
    clock.advance(31_000);
    expect((await call(base, `/v1/endpoints/${ep.id}`)).body.stats.samples_per_second).toBe(0);
    expect((await call(base, `/v1/runs/${created.id}`)).body.progress.elapsed_seconds).toBe(0);
  });
});
