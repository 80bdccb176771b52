import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addHistory, compactHistory, readHistory } from '../src/db/history.js';
import { HISTORY_STEP_MS } from '../src/domain/history.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, tempDir, waitFor } from './support/server.js';
import { openTestStore } from './support/store.js';

type TestServer = Awaited<ReturnType<typeof startTestServer>>;
// 16 waves of the simulator's 8 slots at about 0.4 s each: longer than a history point, so the run
// spans at least two of them.
const SAMPLES = 128;
// Each prompt comes four times: the simulator's prefix cache finds the repeats.
const DISTINCT_PROMPTS = SAMPLES / 4;

const data = tempDir();
let server: TestServer;
let sim: SimProcess;
let runId: string;

const sumOf = (points: { samples: number }[]) => points.reduce((s, p) => s + p.samples, 0);

describe('history on the server', () => {
  beforeAll(async () => {
    [server, sim] = await Promise.all([
      startTestServer({}, data.dir),
      // Slow enough that the run spans more than one of the recorder's 5 s points.
      spawnSimulator({ 'max-running': 8, 'ttft-ms': 100, 'tokens-per-second': 200, 'enable-cache-report': 1 }),
    ]);
    expect((await call(server.url, '/v1/endpoints', { method: 'POST', json: { url: sim.url, name: 'sim-a' } })).status).toBe(201);
  });

  afterAll(async () => {
    await server?.cleanup();
    await sim?.stop();
    data.cleanup();
  });

  it('keeps the whole run: every answer in its series, the fleet within its caps, a finished run at its average', async () => {
    const requests = Array.from({ length: SAMPLES }, (_, i) => ({
      custom_id: `h-${i}`,
      messages: [{ role: 'user', content: `Question ${i % DISTINCT_PROMPTS}` }],
    }));
    const created = await call(server.url, '/v1/runs', { method: 'POST', json: { model: 'sim-model', input: { requests }, quality: false } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    runId = created.body.id;
    const run = await waitFor('the run to complete', async () => {
      const r = await call(server.url, `/v1/runs/${runId}`);
      return r.body.status === 'completed' ? r.body : undefined;
    });
    // The recorder's next point after the finish holds the run's last answers.
    const history = await waitFor('every answer in the run history', async () => {
      const h = await call(server.url, `/v1/runs/${runId}/history`);
      return sumOf(h.body.data) === run.request_counts.completed ? h.body : undefined;
    });
    expect(history.data.length).toBeGreaterThanOrEqual(2);
    for (const p of history.data) expect(p.samples_per_second).toBeCloseTo(p.samples / p.span_seconds, 2);
    expect(history.data.some((p: { cache_hit_rate: number | null }) => (p.cache_hit_rate ?? 0) > 0)).toBe(true);

    const fleet = (await call(server.url, '/v1/history')).body.data;
    expect(sumOf(fleet)).toBe(run.request_counts.completed);
    expect(fleet.some((p: { in_flight: number }) => p.in_flight > 0)).toBe(true);
    for (const p of fleet) {
      expect(p.in_flight).toBeLessThanOrEqual(p.cap);
      for (const e of p.endpoints) expect(e.in_flight).toBeLessThanOrEqual(e.cap);
    }

    // A finished run reads its average over its actual duration, not zero.
    const elapsed = (Date.parse(run.finished_at) - Date.parse(run.started_at)) / 1000;
    expect(run.progress.elapsed_seconds).toBe(Math.round(elapsed));
    expect(run.progress.samples_per_second).toBeCloseTo(run.request_counts.completed / elapsed, 1);
    expect(run.progress.completion_tokens_per_second).toBeGreaterThan(0);
  });

  it('survives a restart', async () => {
    const before = (await call(server.url, `/v1/runs/${runId}/history`)).body.data;
    await server.cleanup();
    server = await startTestServer({}, data.dir);
    expect((await call(server.url, `/v1/runs/${runId}/history`)).body.data).toEqual(before);
    expect((await call(server.url, '/v1/runs/run_nope/history')).status).toBe(404);
  });

  it('merges aged points in the store: counts kept, the series thinner', async () => {
    const db = await openTestStore(data.dir);
    try {
      const now = Date.now();
      const start = Math.floor((now - 3 * 3_600_000) / 60_000) * 60_000;
      const old = Array.from({ length: 24 }, (_, i) => ({
        runId,
        at: start + i * HISTORY_STEP_MS,
        stepMs: HISTORY_STEP_MS,
        spanMs: HISTORY_STEP_MS,
        samples: 3,
        completionTokens: 300,
        promptTokens: 100,
        cachedTokens: 50,
        inFlight: null,
        cap: null,
        endpoints: null,
      }));
      // The server's own recorder compacts too, and may merge the old points first: whoever does,
      // the series ends with the 24 points as 2 and every count kept.
      const before = await readHistory(db, runId);
      await addHistory(db, old);
      await compactHistory(db, now);
      const after = await readHistory(db, runId);
      expect(after.length).toBe(before.length + 2);
      expect(sumOf(after)).toBe(sumOf([...before, ...old]));
      expect(after.filter((p) => p.stepMs === 60_000).map((p) => [p.at, p.samples, p.spanMs])).toEqual([
        [start, 36, 60_000],
        [start + 60_000, 36, 60_000],
      ]);
    } finally {
      await db.close();
    }
  });
});
