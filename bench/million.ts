import { join } from 'node:path';
import { spawnSimulator } from '../src/sim/spawn.js';
import { spawnServer, tempDir, type ServerProcess } from '../test/support/server.js';
import { holdPast, json, uploadFile, memoryOf, percentile, scaled, sleep, until, writePrompts, type Figure } from './support.js';

const MODEL = 'bench-model';
/** Samples answered at the fleet pace before its reads (a tiny-scale run waits for a twentieth of its samples instead). */
const PACED_SAMPLES = 500;
/** A server's fault (the simulators' 500s and 503s) fails its sample at once, as `max_attempts: 1` does the sample's own. */
const FAIL_AT_ONCE = { REGEN_MAX_SERVER_FAULTS: '1' };

interface RunView {
  status: string;
  request_counts: { total: number; completed: number; failed: number };
}

async function timed(base: string, path: string, times: number): Promise<number> {
  const ms: number[] = [];
  for (let i = 0; i < times; i++) {
    const t0 = performance.now();
    const res = await fetch(base + path);
    await res.arrayBuffer();
    if (!res.ok) throw new Error(`GET ${path}: ${res.status}`);
    ms.push(performance.now() - t0);
  }
  return percentile(ms, 50);
}

const done = (r: RunView) => r.request_counts.completed + r.request_counts.failed;

/**
 * One large run on zero-latency simulators: read latencies while it dispatches, the time from a
 * restart after SIGKILL to the first dispatch, and resident memory across the run.
 */
export async function benchMillion(): Promise<Figure[]> {
  // The floor leaves a tiny-scale run long enough to be killed at 40% with most of it still to go.
  const n = scaled(1_000_000, 3000);
  const tmp = tempDir('regen-bench-million-');
  const dataDir = join(tmp.dir, 'data');
  const sims = await Promise.all([0, 1].map(() => spawnSimulator({ model: MODEL, 'max-running': 64, 'max-queue': 100_000, 'error-rate': 0.02 })));
  const slow = await spawnSimulator({ model: MODEL, 'max-running': 64, 'ttft-ms': 500, 'max-queue': 100_000, 'error-rate': 0.02 });
  let server: ServerProcess = await spawnServer(dataDir, FAIL_AT_ONCE);
  try {
    const file = join(tmp.dir, 'prompts.jsonl');
    await writePrompts(file, n);
    const fileId = await uploadFile(server.url, file);
    // One attempt, and (FAIL_AT_ONCE) one server fault, so the simulators' 2% errors leave failed
    // samples for the failed-samples read.
    const run = await json<{ id: string }>(server.url, '/v1/runs', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, input: { file_id: fileId }, params: { max_tokens: 128 }, quality: false, max_attempts: 1 }),
    });
    const view = () => json<RunView>(server.url, `/v1/runs/${run.id}`);
    await until('validation', async () => ((await view()).status === 'queued' ? true : undefined), 600_000, 200);
    const register = (url: string) =>
      json(server.url, '/v1/endpoints', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ url }) });
    // First a pace like a real fleet's (64 slots, 500 ms a request), then the zero-latency
    // simulators join and the process runs flat out.
    await register(slow.url);
    await until('a steady pace', async () => (done(await view()) >= Math.min(PACED_SAMPLES, n / 20) ? true : undefined), 600_000, 200);
    const reads = scaled(200, 20);
    const paced = {
      run: await timed(server.url, `/v1/runs/${run.id}`, reads),
      failed: await timed(server.url, `/v1/runs/${run.id}/samples?status=failed&limit=100`, reads),
    };
    // Each simulator answers at most a quarter of the run from here and holds the rest, so the kill
    // at 40% always finds work left for the restart, whatever the pace: at a tiny scale the reads
    // below can outlast the rest of a run dispatched flat out. At full scale the fast pair alone
    // may answer half the run before holding, well past the kill at 40%.
    const release = await holdPast([...sims, slow], Math.floor(n / 4));
    for (const sim of sims) await register(sim.url);
    await until('10% done', async () => (done(await view()) >= n * 0.1 ? true : undefined), 600_000, 200);
    const rss10 = memoryOf(server.proc.pid!).rssMiB;
    // At a small scale the run is short: fewer reads leave it running for the restart that follows.
    const flatOut = {
      run: await timed(server.url, `/v1/runs/${run.id}`, reads),
      failed: await timed(server.url, `/v1/runs/${run.id}/samples?status=failed&limit=100`, reads),
    };

    await until('40% done', async () => (done(await view()) >= n * 0.4 ? true : undefined), 600_000, 200);
    await server.kill('SIGKILL');
    await release();
    const requests = async () => (await Promise.all([...sims, slow].map((s) => s.stats()))).reduce((a, s) => a + s.requests, 0);
    const before = await requests();
    const t0 = performance.now();
    server = await spawnServer(dataDir, FAIL_AT_ONCE);
    await until('the first dispatch after restart', async () => ((await requests()) > before ? true : undefined), 60_000, 5);
    const recovery = (performance.now() - t0) / 1000;

    await until('50% done', async () => (done(await view()) >= n * 0.5 ? true : undefined), 900_000, 200);
    const rss50 = memoryOf(server.proc.pid!).rssMiB;
    await until('90% done', async () => (done(await view()) >= n * 0.9 ? true : undefined), 900_000, 200);
    const rss90 = memoryOf(server.proc.pid!).rssMiB;
    await until('completion', async () => ((await view()).status === 'completed' ? true : undefined), 900_000, 500);
    await sleep(100);
    const label = `${n.toLocaleString('en')}-sample run`;
    const readRow = (what: string, how: string, ms: number, limit: number): Figure => ({
      part: 'reads',
      figure: `${what} p50, ${label}, ${how}`,
      regen: ms,
      baseline: null,
      unit: 'ms',
      ratio: null,
      target: `≤ ${limit} ms`,
      ok: ms <= limit,
    });
    return [
      readRow('GET /v1/runs/{id}', 'dispatching at a fleet pace (64 slots × 500 ms)', paced.run, 5),
      readRow('GET /v1/runs/{id}/samples?status=failed first page', 'dispatching at a fleet pace', paced.failed, 20),
      readRow('GET /v1/runs/{id}', 'dispatching flat out on zero-latency simulators (CPU saturated)', flatOut.run, 5),
      readRow('GET /v1/runs/{id}/samples?status=failed first page', 'dispatching flat out', flatOut.failed, 20),
      {
        part: 'recovery',
        figure: `process start → first dispatch after SIGKILL at 40% of a ${label} (includes Node start-up)`,
        regen: recovery,
        baseline: null,
        unit: 's',
        ratio: null,
        target: '≤ 2 s',
        ok: recovery <= 2,
      },
      {
        part: 'memory',
        figure: `server RSS growth from 50% to 90% done, ${label} (RSS at 10%: ${rss10.toFixed(0)} MiB, 50%: ${rss50.toFixed(0)} MiB)`,
        regen: rss90 - rss50,
        baseline: null,
        unit: 'MiB',
        ratio: null,
        target: 'flat (≤ 32 MiB)',
        ok: rss90 - rss50 <= 32,
      },
    ];
  } finally {
    await server.kill('SIGTERM');
    await Promise.all([...sims, slow].map((s) => s.stop()));
    tmp.cleanup();
  }
}
