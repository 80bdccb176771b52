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
  it('takes since, until and step on both routes, and never answers more than 2,000 points', async () => {
    // Points of the future, where neither the recorder nor its compaction reaches.
    const t0 = Math.ceil((Date.now() + 86_400_000) / 60_000) * 60_000;
    const COUNT = 2_500;
    const point = (i: number, series: string | null) => ({
      runId: series,
      at: t0 + i * HISTORY_STEP_MS,
      stepMs: HISTORY_STEP_MS,
      spanMs: HISTORY_STEP_MS,
      samples: 1,
      completionTokens: 10,
      promptTokens: 4,
      cachedTokens: 1,
      inFlight: series === null ? 2 : null,
      cap: series === null ? 8 : null,
      endpoints: series === null ? { ep_a: [2, 8] as [number, number] } : null,
    });
    const db = await openTestStore(data.dir);
    try {
      await addHistory(
        db,
        Array.from({ length: COUNT }, (_, i) => point(i, null)),
      );
      await addHistory(
        db,
        Array.from({ length: 24 }, (_, i) => point(i, runId)),
      );
    } finally {
      await db.close();
    }
    const iso = (ms: number) => new Date(ms).toISOString();
    const since = `since=${encodeURIComponent(iso(t0))}`;

    // Unasked, the step is the finest that fits: 2,500 points of 5 s in 10 s buckets, every count kept.
    const fitted = await call(server.url, `/v1/history?${since}`);
    expect(fitted.status, JSON.stringify(fitted.body).slice(0, 300)).toBe(200);
    expect(fitted.body.step_seconds).toBe(10);
    expect(fitted.body.data).toHaveLength(COUNT / 2);
    expect(sumOf(fitted.body.data)).toBe(COUNT);
    expect(fitted.body.data[0]).toMatchObject({
      at: iso(t0),
      span_seconds: 10,
      samples: 2,
      in_flight: 2,
      cap: 8,
      endpoints: [{ endpoint_id: 'ep_a', in_flight: 2, cap: 8 }],
    });

    // A step asked for that would pass the bound is refused, naming the step that fits.
    const tooFine = await call(server.url, `/v1/history?${since}&step=5`);
    expect(tooFine.status).toBe(422);
    expect(tooFine.body).toMatchObject({ code: 'validation_failed', field: 'step' });
    expect(tooFine.body.detail).toContain('ask a step of 10 s or more');

    // A window at the stored step, and the whole at a minute.
    const minute = await call(server.url, `/v1/history?${since}&until=${encodeURIComponent(iso(t0 + 60_000))}&step=5`);
    expect(minute.body.data.map((p: any) => p.at)).toEqual(Array.from({ length: 12 }, (_, i) => iso(t0 + i * HISTORY_STEP_MS)));
    const coarse = await call(server.url, `/v1/history?${since}&step=60`);
    expect(coarse.body.step_seconds).toBe(60);
    expect(coarse.body.data).toHaveLength(Math.ceil((COUNT * HISTORY_STEP_MS) / 60_000));
    expect(sumOf(coarse.body.data)).toBe(COUNT);
    expect(coarse.body.data[0]).toMatchObject({ span_seconds: 60, samples: 12, samples_per_second: 0.2, cache_hit_rate: 0.25 });

    // The run's series the same way.
    const run = await call(server.url, `/v1/runs/${runId}/history?${since}&step=60`);
    expect(run.status).toBe(200);
    expect(run.body.data.map((p: any) => [p.at, p.samples, p.span_seconds])).toEqual([
      [iso(t0), 12, 60],
      [iso(t0 + 60_000), 12, 60],
    ]);

    // Bad values name their parameter.
    for (const [query, field] of [
      ['since=yesterday', 'since'],
      [`${since}&until=${encodeURIComponent(iso(t0 - 1000))}`, 'until'],
      ['step=4', 'step'],
      ['step=99999999999999999999', 'step'],
      ['step=1.5', 'step'],
    ]) {
      for (const path of ['/v1/history', `/v1/runs/${runId}/history`]) {
        const bad = await call(server.url, `${path}?${query}`);
        expect(bad.status, `${path}?${query}`).toBe(422);
        expect(bad.body.field, `${path}?${query}`).toBe(field);
      }
    }
  });
});
