import { join } from 'node:path';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { spawnServer, tempDir, type ServerProcess } from '../test/support/server.js';
import { holdPast, json, uploadFile, memoryOf, percentile, scaled, until, writePrompts, type Figure } from './support.js';

const MODEL = 'bench-model';
/** The larger run is this many times the smaller: the figures must stay flat across it. */
const GROWTH = 10;
/** Samples answered before the reads and the kill: enough for a steady dispatch, whatever the run's size. */
const ANSWERED_BEFORE_READS = 20_000;
const READS = 200;

interface RunView {
  status: string;
  request_counts: { completed: number; failed: number };
}

interface Measured {
  samples: number;
  ingestPerSecond: number;
  getRunP50: number;
  restartToDispatch: number;
  peakRssIngestAndDispatch: number;
  peakRssAfterRestart: number;
}

/**
 * One run of `samples` prompts on the embedded defaults (a SQLite file, the local store): the
 * ingest rate, GET /v1/runs/{id} while it dispatches on zero-latency simulators, the time from a
 * restart after SIGKILL to the first dispatch, and the server's peak resident memory before and
 * after the restart. The run is not taken to its end: what grows with its size is the database,
 * and every figure here is read with the whole of it in place.
 */
async function measure(samples: number, sims: SimProcess[]): Promise<Measured> {
  const tmp = tempDir('regen-bench-scale-');
  const dataDir = join(tmp.dir, 'data');
  let server: ServerProcess | undefined;
  try {
    server = await spawnServer(dataDir);
    const file = join(tmp.dir, 'prompts.jsonl');
    await writePrompts(file, samples);
    const fileId = await uploadFile(server.url, file);
    const t0 = performance.now();
    const run = await json<{ id: string }>(server.url, '/v1/runs', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, input: { file_id: fileId }, params: { max_tokens: 64 }, quality: false }),
    });
    const view = () => json<RunView>(server!.url, `/v1/runs/${run.id}`);
    await until(
      'validation',
      async () => {
        const { status } = await view();
        if (status === 'failed') throw new Error('the run failed validation');
        return status === 'queued' ? true : undefined;
      },
      3_600_000,
      100,
    );
    const ingestPerSecond = samples / ((performance.now() - t0) / 1000);

    // Each simulator answers at most a third of the run and holds the rest, so a third, more than
    // `enough`, is left for the restart to dispatch, whatever the pace: at a tiny scale a quick dispatch beside
    // slow reads has otherwise finished the run before the kill, and the wait for a dispatch after
    // the restart never ended. At full scale the hold lies far past anything the reads wait for.
    const release = await holdPast(sims, Math.floor(samples / 3));
    for (const sim of sims) {
      await json(server.url, '/v1/endpoints', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ url: sim.url }) });
    }
    const done = async () => {
      const r = await view();
      return r.request_counts.completed + r.request_counts.failed;
    };
    const enough = Math.min(ANSWERED_BEFORE_READS, Math.floor(samples / 4));
    await until('a steady dispatch', async () => ((await done()) >= enough ? true : undefined), 600_000, 100);
    const ms: number[] = [];
    for (let i = 0; i < scaled(READS, 20); i++) {
      const t = performance.now();
      await view();
      ms.push(performance.now() - t);
    }
    const peakRssIngestAndDispatch = memoryOf(server.proc.pid!).peakMiB;

    await server.kill('SIGKILL');
    await release();
    const requests = async () => (await Promise.all(sims.map((s) => s.stats()))).reduce((a, s) => a + s.requests, 0);
    const before = await requests();
    const t1 = performance.now();
    server = await spawnServer(dataDir);
    await until('the first dispatch after restart', async () => ((await requests()) > before ? true : undefined), 120_000, 5);
    const restartToDispatch = (performance.now() - t1) / 1000;
    await until('a steady dispatch after restart', async () => ((await requests()) >= before + enough ? true : undefined), 600_000, 100);
    const peakRssAfterRestart = memoryOf(server.proc.pid!).peakMiB;
    return { samples, ingestPerSecond, getRunP50: percentile(ms, 50), restartToDispatch, peakRssIngestAndDispatch, peakRssAfterRestart };
  } finally {
    await server?.kill('SIGTERM');
    tmp.cleanup();
  }
}

/**
 * A run ten times larger on SQLite, side by side with the smaller one on the same simulators: each
 * figure's ratio (large ÷ small; for a rate small ÷ large, so above 1 means it got worse) is what
 * must stay near 1.
 */
export async function benchScale(): Promise<Figure[]> {
  const small = scaled(1_000_000, 300);
  const sims = await Promise.all([0, 1].map(() => spawnSimulator({ model: MODEL, 'max-running': 64, 'max-queue': 100_000 })));
  try {
    const a = await measure(small, sims);
    const b = await measure(small * GROWTH, sims);
    const label = (m: Measured) => `${m.samples.toLocaleString('en')} samples`;
    const row = (figure: string, unit: string, get: (m: Measured) => number, higherIsBetter: boolean, limit: number): Figure => {
      const ratio = higherIsBetter ? get(a) / get(b) : get(b) / get(a);
      return {
        part: 'scale',
        figure: `${figure}, ${label(b)} (baseline: ${label(a)}; ratio: how many times worse)`,
        regen: get(b),
        baseline: get(a),
        unit,
        ratio,
        target: `ratio ≤ ${limit}`,
        ok: ratio <= limit,
      };
    };
    return [
      row('ingest rate (run created → queued)', 'prompts/s', (m) => m.ingestPerSecond, true, 1.25),
      row('GET /v1/runs/{id} p50 while dispatching flat out', 'ms', (m) => m.getRunP50, false, 1.5),
      row('process start → first dispatch after SIGKILL', 's', (m) => m.restartToDispatch, false, 1.5),
      row('peak RSS through ingest and dispatch', 'MiB', (m) => m.peakRssIngestAndDispatch, false, 1.25),
      row('peak RSS after the restart, dispatching', 'MiB', (m) => m.peakRssAfterRestart, false, 1.25),
    ];
  } finally {
    await Promise.all(sims.map((s) => s.stop()));
  }
}
