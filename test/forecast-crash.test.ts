import { and, count, eq } from 'drizzle-orm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { openTestStore } from './support/store.js';
import { checkOutput, createRun, expectCountersMatchRecount, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// A slice of one sample in each stratum of four, and no more input than that needs: the rest of the
// run only shows that the slice was answered first.
const SAMPLES = 600;
const SLICE = 150;
// 16 at once, ~100 ms an answer: the slice takes about a second, and the kill lands inside it (at a
// quarter of it, polled every 20 ms).
const SIM = { 'ttft-ms': 30, 'tokens-per-second': 1000, 'completion-tokens': 64, 'max-running': 16 };

const data = tempDir('regen-forecast-crash-');
let sim: SimProcess;
let server: ServerProcess | null = null;

beforeAll(async () => {
  sim = await spawnSimulator(SIM);
});

afterAll(async () => {
  await server?.kill('SIGKILL');
  await sim?.stop();
  data.cleanup();
});

async function sliceOf(runId: string): Promise<{ seqs: number[]; completedOutside: number }> {
  const db = await openTestStore(data.dir);
  try {
    const { samples } = db.t;
    const seqs = (
      await db.q
        .select({ seq: samples.seq })
        .from(samples)
        .where(and(eq(samples.runId, runId), eq(samples.calibration, true)))
        .orderBy(samples.seq)
    ).map((r) => r.seq);
    const [outside] = await db.q
      .select({ n: count() })
      .from(samples)
      .where(and(eq(samples.runId, runId), eq(samples.calibration, false), eq(samples.status, 'completed')));
    return { seqs, completedOutside: outside.n };
  } finally {
    await db.close();
  }
}

describe('a SIGKILL during the calibration slice', () => {
  it('loses nothing, keeps the same slice, and answers the slice before the rest', async () => {
    server = await spawnServer(data.dir);
    await registerEndpoint(server.url, sim.url);
    const prompts = makePrompts(SAMPLES, 'k');
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const { id } = await createRun(server.url, {
      model: 'sim-model',
      input: { file_id: fileId },
      shard_size: 100,
      regenerate: 'last_assistant',
      calibration: { samples: SLICE },
    });
    const url = server.url;
    const seen = await waitFor(
      'part of the slice answered',
      async () => {
        const run = (await call(url, `/v1/runs/${id}`)).body;
        return run.request_counts.completed >= SLICE / 4 ? run : undefined;
      },
      60_000,
      20,
    );
    expect(seen.request_counts.completed).toBeLessThan(SLICE);
    await server.kill('SIGKILL');
    const left = await sliceOf(id);
    expect(left.seqs).toHaveLength(SLICE);
    // Spread over the whole input, one in each stratum of four samples.
    expect(left.seqs.map((s) => Math.floor(s / (SAMPLES / SLICE)))).toEqual(left.seqs.map((_, i) => i));
    // The slice is claimed first: nothing outside it was answered yet.
    expect(left.completedOutside).toBe(0);

    server = await spawnServer(data.dir);
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    expect((await sliceOf(id)).seqs).toEqual(left.seqs);
    expect(done.forecast.based_on_samples).toBeGreaterThan(0);

    const stores = new Stores({ forcePathStyle: false });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    expect([...out.lines.values()].filter((l) => l.attempts !== 1).map((l) => l.custom_id)).toEqual([]);
    await expectCountersMatchRecount(server.url, done);
  });
});
