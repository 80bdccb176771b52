import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, startTestServer, waitFor } from './support/server.js';
import {
  checkOutput,
  createRun,
  DEAD_ENDPOINT_ERROR,
  expectCountersMatchRecount,
  getRun,
  makePrompts,
  registerEndpoint,
  uploadFile,
  waitForStatus,
  type Prompts,
} from './support/runner-checks.js';

// Each scenario has its own model name, so its runs only ever reach its own simulators.
// ~60 ms an answer (40 ms to the first token, ~100 tokens at 4,000 a second): every scenario has
// requests in flight at its fault, and none waits on the simulator for long.
const LATENCY = { 'ttft-ms': 40, 'tokens-per-second': 4000 };
const TERMINAL = ['completed', 'failed', 'cancelled', 'paused'];
// A failed request's first wait before its sample is sent again (0.5 s by default): the retries
// here are the point, not how long they wait, and the wait still doubles after each failure.
const RETRY = { REGEN_REQUEST_RETRY_MS: '50' };

let server: Awaited<ReturnType<typeof startTestServer>>;
const sims: SimProcess[] = [];
const stores = new Stores({ forcePathStyle: false });

async function sim(flags: Record<string, string | number>): Promise<SimProcess> {
  const s = await spawnSimulator({ ...LATENCY, ...flags });
  sims.push(s);
  return s;
}

async function endpointOf(s: SimProcess): Promise<any> {
  return registerEndpoint(server.url, s.url);
}

async function startRun(model: string, prompts: Prompts, extra: Record<string, unknown> = {}): Promise<string> {
  const fileId = await uploadFile(server.url, prompts.jsonl);
  return (await createRun(server.url, { model, input: { file_id: fileId }, regenerate: 'last_assistant', ...extra })).id;
}

const doneOf = (run: any) => run.request_counts.completed + run.request_counts.failed + run.request_counts.cancelled;

async function waitForDone(base: string, id: string, n: number): Promise<any> {
  return waitFor(`run ${id} to have ${n} samples done`, async () => {
    const run = await getRun(base, id);
    return doneOf(run) >= n ? run : undefined;
  });
}

beforeAll(async () => {
  server = await startTestServer(RETRY);
});

afterAll(async () => {
  await server?.cleanup();
  await Promise.all(sims.map((s) => s.stop()));
  stores.close();
});

describe('runner faults', () => {
  it('moves the samples of an endpoint that dies mid-run to the other one and marks it unhealthy', async () => {
    const dying = await sim({ model: 'm-death', 'max-running': 8, 'die-after': 120 });
    const steady = await sim({ model: 'm-death', 'max-running': 8 });
    const [epDying, epSteady] = [await endpointOf(dying), await endpointOf(steady)];
    const prompts = makePrompts(500, 'death');
    const id = await startRun('m-death', prompts);
    const done = await waitForStatus(server.url, id, TERMINAL);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ completed: 500, failed: 0 });
    expect(dying.proc.exitCode).toBe(1);

    const dead = (await call(server.url, `/v1/endpoints/${epDying.id}`)).body;
    expect(dead.state).toBe('unhealthy');
    expect(dead.last_error).toMatch(DEAD_ENDPOINT_ERROR);
    expect(dead.in_flight).toBe(0);

    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(500);
    const byEndpoint = (ep: string) => [...out.lines.values()].filter((l) => l.endpoint_id === ep).length;
    // The 120th request killed it: fewer than 120 answers came from it, the rest from the other.
    expect(byEndpoint(epDying.id)).toBeGreaterThan(0);
    expect(byEndpoint(epDying.id)).toBeLessThan(120);
    expect(byEndpoint(epSteady.id)).toBe(500 - byEndpoint(epDying.id));
    // Samples in flight on it when it died were asked again elsewhere.
    expect([...out.lines.values()].some((l) => l.attempts > 1 && l.endpoint_id === epSteady.id)).toBe(true);
    await expectCountersMatchRecount(server.url, done);

    // Still probed every interval: a server back on the same address is taken into rotation again.
    await sim({ model: 'm-death', 'max-running': 8, port: dying.port });
    await waitFor(
      'the endpoint to be ready again',
      async () => {
        const e = (await call(server.url, `/v1/endpoints/${epDying.id}`)).body;
        return e.state === 'ready' ? e : undefined;
      },
      30_000,
    );
  });

  it('fails a prompt longer than the context at once with the server message, then retry rewrites the shard whole', async () => {
    const small = await sim({ model: 'm-ctx', 'max-running': 8, 'context-length': 200 });
    const ep = await endpointOf(small);
    const prompts = makePrompts(60, 'ctx');
    const long = ['ctx-long-a', 'ctx-long-b'];
    const lines = [prompts.jsonl.trimEnd()];
    for (const cid of long) {
      const messages = [{ role: 'user', content: `${cid}: ${'a very long question '.repeat(60)}` }];
      lines.push(JSON.stringify({ custom_id: cid, messages }));
      prompts.expected.set(cid, messages);
    }
    prompts.jsonl = lines.join('\n') + '\n';
    const id = await startRun('m-ctx', prompts, { shard_size: 25 });
    const done = await waitForStatus(server.url, id, TERMINAL);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: 62, completed: 60, failed: 2 });

    const store = stores.forUri(done.output_uri);
    const before = await checkOutput(store, prompts.expected);
    expect(before.lines.size).toBe(60);
    expect([...before.errors.keys()].sort()).toEqual(long);
    for (const cid of long) {
      const e = before.errors.get(cid);
      expect(e.attempts).toBe(1);
      expect(e.error.status).toBe(400);
      expect(e.error.code).toBe('invalid_request');
      expect(e.error.message).toMatch(/^The input \(\d+ tokens\) is longer than the model's context length \(200 tokens\)\.$/);
      const s = (await call(server.url, `/v1/runs/${id}/samples/${cid}`)).body;
      expect(s).toMatchObject({ status: 'failed', attempts: 1, error: e.error, output: null });
    }
    const lastShard = before.manifest.shards.at(-1);
    expect(lastShard).toMatchObject({ index: 2, lines: 10, errors_key: 'shard-00002.errors.jsonl', errors_lines: 2 });
    expect((await small.stats()).requests).toBe(62);
    const oldShard = (await store.get('shard-00002.jsonl')).toString('utf8');

    // A larger context, then the failed two again: their shard is written again with all its lines.
    await small.configure({ contextLength: 100_000 });
    // regen reads the context at its next probe, and until then takes a prompt past 200 tokens for a malformed answer.
    const context = async () => (await call(server.url, `/v1/endpoints/${ep.id}`)).body.capacity.max_model_len;
    await waitFor('the larger context seen', async () => ((await context()) === 100_000 ? true : undefined));
    const retried = await call(server.url, `/v1/runs/${id}/retry`, { method: 'POST', json: { only: 'failed' } });
    expect(retried.status).toBe(200);
    // The answer is the run as the retry left it, read in the retry's own transaction: the runner
    // cannot have claimed the two yet.
    expect(retried.body.request_counts).toEqual({ total: 62, pending: 2, in_progress: 0, completed: 60, failed: 0, cancelled: 0 });
    expect(retried.body.status).toBe('queued');
    const again = await waitForStatus(server.url, id, TERMINAL);
    expect(again.status).toBe('completed');
    expect(again.request_counts).toMatchObject({ total: 62, completed: 62, failed: 0 });
    expect(again.shards).toEqual({ total: 3, uploaded: 3 });

    const after = await checkOutput(store, prompts.expected);
    expect(after.lines.size).toBe(62);
    expect(after.errors.size).toBe(0);
    expect(await store.head('shard-00002.errors.jsonl')).toBeNull();
    expect(after.manifest.shards[2]).toMatchObject({ lines: 12, errors_key: null });
    expect(after.manifest.counts).toEqual({ total: 62, completed: 62, failed: 0, cancelled: 0 });
    // The untouched shards are byte for byte what they were; the reopened one keeps its old lines as they were.
    expect(after.manifest.shards[0].sha256).toBe(before.manifest.shards[0].sha256);
    const newShard = (await store.get('shard-00002.jsonl')).toString('utf8');
    for (const line of oldShard.trimEnd().split('\n')) expect(newShard).toContain(line + '\n');
    expect((await small.stats()).requests).toBe(64);
    await expectCountersMatchRecount(server.url, again);
  });

  it('retries 5xx answers until every sample completes', async () => {
    const flaky = await sim({ model: 'm-flaky', 'max-running': 8, 'error-rate': 0.3, seed: 7 });
    await endpointOf(flaky);
    const prompts = makePrompts(200, 'flaky');
    const id = await startRun('m-flaky', prompts, { max_attempts: 12 });
    const done = await waitForStatus(server.url, id, TERMINAL);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ completed: 200, failed: 0 });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(200);
    const retried = [...out.lines.values()].filter((l) => l.attempts > 1);
    expect(retried.length).toBeGreaterThan(10);
    const stats = await flaky.stats();
    expect(stats.errors).toBeGreaterThan(0);
    // Every request the simulator saw is one attempt of one sample.
    expect([...out.lines.values()].reduce((t, l) => t + l.attempts, 0)).toBe(stats.requests);
    await expectCountersMatchRecount(server.url, done);
  });

  it('retries timeouts and dropped connections until every sample completes', async () => {
    const rough = await sim({ model: 'm-rough', 'max-running': 8, 'hang-rate': 0.05, 'reset-rate': 0.05, seed: 11 });
    await endpointOf(rough);
    const prompts = makePrompts(150, 'rough');
    const id = await startRun('m-rough', prompts, { max_attempts: 12, request_timeout_ms: 1000 });
    const done = await waitForStatus(server.url, id, TERMINAL);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ completed: 150, failed: 0 });
    const stats = await rough.stats();
    expect(stats.hangs).toBeGreaterThan(0);
    expect(stats.resets).toBeGreaterThan(0);
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(150);
    expect([...out.lines.values()].some((l) => l.attempts > 1)).toBe(true);
    await expectCountersMatchRecount(server.url, done);
  });

  it("fails a sample with its last error once its budget for the server's faults is spent, whatever max_attempts says", async () => {
    // A budget of two server faults: on a server that always fails, each sample is sent twice.
    const strict = await startTestServer({ ...RETRY, REGEN_MAX_SERVER_FAULTS: '2' });
    try {
      const broken = await sim({ model: 'm-broken', 'max-running': 4, 'error-rate': 1 });
      await registerEndpoint(strict.url, broken.url);
      const prompts = makePrompts(12, 'broken');
      const fileId = await uploadFile(strict.url, prompts.jsonl);
      const id = (await createRun(strict.url, { model: 'm-broken', input: { file_id: fileId }, regenerate: 'last_assistant', max_attempts: 10 })).id;
      const done = await waitForStatus(strict.url, id, TERMINAL);
      expect(done.status).toBe('completed');
      expect(done.request_counts).toMatchObject({ total: 12, completed: 0, failed: 12 });
      const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
      expect(out.lines.size).toBe(0);
      expect(out.errors.size).toBe(12);
      for (const e of out.errors.values()) {
        expect(e.attempts).toBe(2);
        expect(e.error.code).toBe('server_error');
        expect(e.error.message).toBe(e.error.status === 500 ? 'Internal server error' : 'Service temporarily unavailable');
      }
      expect((await broken.stats()).requests).toBe(24);
      const all = await expectCountersMatchRecount(strict.url, done);
      // The first fault was refunded and counted apart; the last send is the one attempt charged.
      expect(all.every((s) => s.status === 'failed' && s.attempts === 2 && s.server_faults === 1 && s.error.code === 'server_error')).toBe(true);
    } finally {
      await strict.cleanup();
    }
  });

  it('pauses (in-flight requests finish, nothing new is sent), resumes, and finishes', async () => {
    const s = await sim({ model: 'm-pause', 'max-running': 8, 'ttft-ms': 150 });
    await endpointOf(s);
    const prompts = makePrompts(200, 'pause');
    const id = await startRun('m-pause', prompts);
    await waitForDone(server.url, id, 40);
    const paused = await call(server.url, `/v1/runs/${id}/pause`, { method: 'POST' });
    expect(paused.status).toBe(200);
    expect(paused.body.status).toBe('paused');
    const settled = await waitFor('in-flight requests to finish', async () => {
      const run = await getRun(server.url, id);
      return run.request_counts.in_progress === 0 ? run : undefined;
    });
    const statsThen = await s.stats();
    expect(statsThen.running).toBe(0);
    expect(statsThen.aborted).toBe(0);
    await new Promise((r) => setTimeout(r, 1500));
    expect((await s.stats()).requests).toBe(statsThen.requests);
    const still = await getRun(server.url, id);
    expect(still.status).toBe('paused');
    expect(still.request_counts).toEqual(settled.request_counts);
    expect(still.request_counts.pending).toBeGreaterThan(0);

    const resumed = await call(server.url, `/v1/runs/${id}/resume`, { method: 'POST' });
    expect(resumed.status).toBe(200);
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'cancelled']);
    expect(done.status).toBe('completed');
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(200);
    expect((await s.stats()).requests).toBe(200);
    await expectCountersMatchRecount(server.url, done);
  });

  it('cancels mid-run: in-flight requests are aborted, completed samples are written, the manifest says cancelled', async () => {
    const s = await sim({ model: 'm-cancel', 'max-running': 8, 'ttft-ms': 400 });
    await endpointOf(s);
    const prompts = makePrompts(300, 'cancel');
    const id = await startRun('m-cancel', prompts, { shard_size: 50 });
    await waitFor('requests in flight after some are done', async () => {
      const run = await getRun(server.url, id);
      return doneOf(run) >= 30 && run.request_counts.in_progress > 0 ? run : undefined;
    });
    const cancelled = await call(server.url, `/v1/runs/${id}/cancel`, { method: 'POST' });
    expect(cancelled.status).toBe(200);
    expect(cancelled.body.status).toBe('cancelling');
    const done = await waitForStatus(server.url, id, ['cancelled', 'completed', 'failed']);
    expect(done.status).toBe('cancelled');
    const c = done.request_counts;
    expect(c.pending + c.in_progress).toBe(0);
    expect(c.completed).toBeGreaterThanOrEqual(30);
    expect(c.cancelled).toBeGreaterThan(0);
    expect(c.completed + c.cancelled).toBe(300);
    await waitFor('the simulator to see the aborts', async () => ((await s.stats()).aborted > 0 ? true : undefined), 10_000);
    expect((await s.stats()).running).toBe(0);

    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.manifest.run.status).toBe('cancelled');
    expect(out.manifest.counts).toMatchObject({ completed: c.completed, cancelled: c.cancelled });
    expect(out.lines.size).toBe(c.completed);
    const all = await expectCountersMatchRecount(server.url, done);
    for (const x of all) expect(out.lines.has(x.custom_id)).toBe(x.status === 'completed');
  });
});
