import { join } from 'node:path';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { spawnServer, tempDir, type ServerProcess } from '../test/support/server.js';
import { json, scaled, sleep, submitPrompts, until, type Figure } from './support.js';

// A server like a default-launched SGLang whose advertised running limit (2048) is far past what
// its KV pool holds: past the pool it retracts and thrashes (the simulator's --kv-admission none).
// Fixed caps are swept on it, then the adaptive cap is measured, told nothing.
const MODEL = 'bench-kv';
const RUNNING_LIMIT = 2048;
// About 25 prompt tokens and 150 generated on average: the pool holds about 110 requests.
const KV_TOKENS = 20_000;
const SIM = {
  model: MODEL,
  'max-running': RUNNING_LIMIT,
  'kv-tokens': KV_TOKENS,
  // BENCH_KV_ADMISSION=optimistic: SGLang's own admission instead, which queues what its pool cannot take.
  'kv-admission': process.env.BENCH_KV_ADMISSION ?? 'none',
  // SGLang's waiting queue is unbounded by default (docs/sglang.md "Capacity"): a fixed cap past the pool thrashes, it is not turned away.
  'max-queue': 1_000_000,
  'tokens-per-second': 200,
  'completion-tokens': 300,
  'reasoning-tokens': 0,
};
const CAPS = [16, 32, 48, 64, 80, 96, 128, 192, 512, RUNNING_LIMIT];
/** The adaptive cap's goal against the best fixed cap, and the retractions SGLang's tuning guide calls rare (about one a minute; two leaves room for the minute a knee is tried again). */
const ADAPTIVE_SHARE = 0.98;
const RARE_RETRACTIONS_PER_MINUTE = 2;
/** How long the adaptive cap is measured after its warm-up: long enough that a retraction a minute reads as one. */
const ADAPTIVE_WINDOW_MS = 60_000;

async function setup(
  env: Record<string, string>,
): Promise<{ server: ServerProcess; sim: SimProcess; endpointId: string; runId: string; startedAt: number; stop(): Promise<void> }> {
  const tmp = tempDir('regen-bench-adaptive-');
  const sim = await spawnSimulator(SIM);
  const server = await spawnServer(join(tmp.dir, 'data'), { REGEN_LOAD_INTERVAL_MS: '250', ...env }).catch(async (err: Error) => {
    await sim.stop();
    tmp.cleanup();
    throw err;
  });
  const stop = async () => {
    await server.kill('SIGKILL');
    await sim.stop();
    tmp.cleanup();
  };
  try {
    const ep = await json<{ id: string }>(server.url, '/v1/endpoints', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ url: sim.url }),
    });
    await until('the endpoint ready', async () => ((await json(server.url, `/v1/endpoints/${ep.id}`)).state === 'ready' ? true : undefined), 30_000);
    const startedAt = Date.now();
    const runId = await submitPrompts(server.url, scaled(60_000, 200), { model: MODEL, params: { max_tokens: 1024 }, quality: false });
    return { server, sim, endpointId: ep.id, runId, startedAt, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** How long the simulator's stats are waited for: past it, fetch would wait minutes for a thrashing server's headers. */
const STATS_TIMEOUT_MS = 10_000;

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer in ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

interface Window {
  /** Completions per second. */
  rate: number;
  /** Requests the server retracted, per minute. */
  retractionsPerMinute: number;
  /** Requests the server retracted from the run's start to the window's end, and the minutes that took. */
  retractedInRun: number;
  runMinutes: number;
}

/**
 * Completions and retractions per unit of time over `ms`, after `warmMs` for the cap to take hold;
 * and the retractions of the whole run so far (each simulator serves one rig), its first seconds included.
 */
async function measure(rig: { server: ServerProcess; sim: SimProcess; runId: string; startedAt: number }, warmMs: number, ms: number): Promise<Window> {
  await sleep(warmMs);
  const completed = async () => (await json<{ request_counts: { completed: number } }>(rig.server.url, `/v1/runs/${rig.runId}`)).request_counts.completed;
  // A server thrashing at thousands of requests may not answer its stats in time: its count is then unknown.
  const retracted = async () => (await withTimeout(rig.sim.stats(), STATS_TIMEOUT_MS).catch(() => ({ retracted: Number.NaN }))).retracted;
  const [a, r0] = [await completed(), await retracted()];
  const t0 = Date.now();
  await sleep(ms);
  const [b, r1] = [await completed(), await retracted()];
  const seconds = (Date.now() - t0) / 1000;
  return { rate: (b - a) / seconds, retractionsPerMinute: ((r1 - r0) * 60) / seconds, retractedInRun: r1, runMinutes: (Date.now() - rig.startedAt) / 60_000 };
}

export async function benchAdaptive(): Promise<Figure[]> {
  const warmMs = scaled(6000, 100);
  const ms = scaled(15_000, 250);
  // A window of 15 s would read a single retraction as 4 a minute: the adaptive cap is measured over minutes.
  const adaptiveMs = scaled(ADAPTIVE_WINDOW_MS, 250);
  const fixed = new Map<number, Window>();
  const swept = await setup({ REGEN_ADAPTIVE_CONCURRENCY: 'false' });
  try {
    for (const cap of CAPS) {
      await json(swept.server.url, `/v1/endpoints/${swept.endpointId}`, {
        method: 'PATCH',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ max_concurrency: cap }),
      });
      const got = await measure(swept, warmMs, ms);
      fixed.set(cap, got);
      console.error(`  fixed cap ${cap}: ${got.rate.toFixed(1)} samples/s, ${got.retractionsPerMinute.toFixed(0)} retractions/min`);
    }
  } finally {
    await swept.stop();
  }
  const adaptiveRig = await setup({});
  let adaptive: Window;
  let capSeen: number;
  try {
    adaptive = await measure(adaptiveRig, 2 * warmMs, adaptiveMs);
    capSeen = (await json<{ max_concurrency: number }>(adaptiveRig.server.url, `/v1/endpoints/${adaptiveRig.endpointId}`)).max_concurrency;
    console.error(
      `  adaptive: ${adaptive.rate.toFixed(1)} samples/s at cap ${capSeen}, ${adaptive.retractionsPerMinute.toFixed(1)} retractions/min in the window, ${adaptive.retractedInRun} in the whole run of ${adaptive.runMinutes.toFixed(2)} min`,
    );
  } finally {
    await adaptiveRig.stop();
  }
  const [bestCap, { rate: best }] = [...fixed].reduce((a, b) => (b[1].rate > a[1].rate ? b : a));
  // A thrashing server may not answer its stats in time: its retractions go unread, not NaN.
  const perMinute = (v: number) => (Number.isNaN(v) ? 'retractions unread' : `${v.toFixed(0)}/min`);
  const sweep = [...fixed].map(([cap, v]) => `${cap}: ${v.rate.toFixed(1)} (${perMinute(v.retractionsPerMinute)})`).join(', ');
  const figure = (name: string, regen: number, target: string, ok: boolean): Figure => ({
    part: 'adaptive',
    figure: name,
    regen,
    baseline: best,
    unit: 'samples/s',
    ratio: regen / best,
    target,
    ok,
  });
  const fixedRate = (cap: number) => fixed.get(cap)!.rate;
  const inRunPerMinute = adaptive.retractedInRun / adaptive.runMinutes;
  return [
    figure(
      `adaptive cap, told nothing (settled at ${capSeen}) vs the best fixed cap (${bestCap}; sweep, samples/s and retractions/min: ${sweep})`,
      adaptive.rate,
      `≥ ${ADAPTIVE_SHARE} × best fixed cap`,
      adaptive.rate >= ADAPTIVE_SHARE * best,
    ),
    {
      part: 'adaptive',
      figure: `requests the server retracted per minute under the adaptive cap, over the whole run (${adaptive.retractedInRun} in ${adaptive.runMinutes.toFixed(2)} min, its first seconds included; ${adaptive.retractionsPerMinute.toFixed(1)}/min in the measured window; SGLang counts each retracted request once)`,
      regen: inRunPerMinute,
      baseline: null,
      unit: '/min',
      ratio: null,
      target: `≤ ${RARE_RETRACTIONS_PER_MINUTE} (SGLang's guide: rare, about one a minute)`,
      ok: inRunPerMinute <= RARE_RETRACTIONS_PER_MINUTE,
    },
    figure('a fixed cap of 32 (the old default) vs the best fixed cap', fixedRate(32), '< 0.95 × best (falls short)', fixedRate(32) < 0.95 * best),
    figure(
      `a fixed cap at the server's running limit (${RUNNING_LIMIT}) vs the best fixed cap`,
      fixedRate(RUNNING_LIMIT),
      '< 0.95 × best (falls short)',
      fixedRate(RUNNING_LIMIT) < 0.95 * best,
    ),
  ];
}
