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
  'kv-admission': 'none',
  'tokens-per-second': 200,
  'completion-tokens': 300,
  'reasoning-tokens': 0,
};
const CAPS = [16, 32, 64, 96, 128, 192, 512, RUNNING_LIMIT];

async function setup(
  env: Record<string, string>,
): Promise<{ server: ServerProcess; sim: SimProcess; endpointId: string; runId: string; stop(): Promise<void> }> {
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
    const runId = await submitPrompts(server.url, scaled(60_000, 200), { model: MODEL, params: { max_tokens: 1024 }, quality: false });
    return { server, sim, endpointId: ep.id, runId, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Completions per second over `ms`, after `warmMs` for the cap to take hold. */
async function throughput(server: ServerProcess, runId: string, warmMs: number, ms: number): Promise<number> {
  await sleep(warmMs);
  const completed = async () => (await json<{ request_counts: { completed: number } }>(server.url, `/v1/runs/${runId}`)).request_counts.completed;
  const a = await completed();
  const t0 = Date.now();
  await sleep(ms);
  return ((await completed()) - a) / ((Date.now() - t0) / 1000);
}

export async function benchAdaptive(): Promise<Figure[]> {
  const warmMs = scaled(6000, 100);
  const ms = scaled(15_000, 250);
  const fixed = new Map<number, number>();
  const swept = await setup({ REGEN_ADAPTIVE_CONCURRENCY: 'false' });
  try {
    for (const cap of CAPS) {
      await json(swept.server.url, `/v1/endpoints/${swept.endpointId}`, {
        method: 'PATCH',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ max_concurrency: cap }),
      });
      fixed.set(cap, await throughput(swept.server, swept.runId, warmMs, ms));
      console.error(`  fixed cap ${cap}: ${fixed.get(cap)!.toFixed(1)} samples/s`);
    }
  } finally {
    await swept.stop();
  }
  const adaptiveRig = await setup({});
  let adaptive: number;
  let capSeen: number;
  let retracted: number;
  try {
    adaptive = await throughput(adaptiveRig.server, adaptiveRig.runId, 2 * warmMs, ms);
    capSeen = (await json<{ max_concurrency: number }>(adaptiveRig.server.url, `/v1/endpoints/${adaptiveRig.endpointId}`)).max_concurrency;
    retracted = (await adaptiveRig.sim.stats()).retracted;
    console.error(`  adaptive: ${adaptive.toFixed(1)} samples/s at cap ${capSeen}`);
  } finally {
    await adaptiveRig.stop();
  }
  const [bestCap, best] = [...fixed].reduce((a, b) => (b[1] > a[1] ? b : a));
  const sweep = [...fixed].map(([cap, v]) => `${cap}: ${v.toFixed(1)}`).join(', ');
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
  return [
    figure(
      `adaptive cap, told nothing (settled at ${capSeen}, ${retracted} retractions at the server) vs the best fixed cap (${bestCap}; sweep ${sweep})`,
      adaptive,
      '≥ 0.95 × best fixed cap',
      adaptive >= 0.95 * best,
    ),
    figure('a fixed cap of 32 (the old default) vs the best fixed cap', fixed.get(32)!, '< 0.95 × best (falls short)', fixed.get(32)! < 0.95 * best),
    figure(
      `a fixed cap at the server's running limit (${RUNNING_LIMIT}) vs the best fixed cap`,
      fixed.get(RUNNING_LIMIT)!,
      '< 0.95 × best (falls short)',
      fixed.get(RUNNING_LIMIT)! < 0.95 * best,
    ),
  ];
}
