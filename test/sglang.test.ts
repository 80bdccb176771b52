import { once } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { serverCeiling } from '../src/runner/capacity.js';
import { call, startTestServer, waitFor } from './support/server.js';
import { checkOutput, createRun, getRun, listAllSamples, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// regen against simulator processes configured as real SGLang servers are launched
// (docs/sglang.md): no --max-running-requests, a slow /health, aborted answers, a drain on
// SIGTERM, a 5 s keep-alive, a served name that is a local path, a restart with another model.
// Each scenario has its own model name, so its runs reach only its own simulators. What is proven
// here is regen's dispatch and probing (the runner's own memory), not the store: these run on one
// store; the probe's conditional write against an operator is in sglang-operator-state.test.ts.

const TERMINAL = ['completed', 'failed', 'cancelled', 'paused'];
let server: Awaited<ReturnType<typeof startTestServer>>;
const sims: SimProcess[] = [];
const stores = new Stores({ forcePathStyle: false });

async function sim(flags: Record<string, string | number>): Promise<SimProcess> {
  const s = await spawnSimulator(flags);
  sims.push(s);
  return s;
}

async function run(model: string, n: number, tag: string, extra: Record<string, unknown> = {}) {
  const prompts = makePrompts(n, tag);
  const fileId = await uploadFile(server.url, prompts.jsonl);
  const created = await createRun(server.url, { model, input: { file_id: fileId }, regenerate: 'last_assistant', shard_size: 250, ...extra });
  return { id: created.id as string, prompts };
}

/** Reads an endpoint every 50 ms until `stop()`, keeping the most in flight seen and every state it was in. */
function watchEndpoint(id: string) {
  let stopped = false;
  const seen = { maxInFlight: 0, states: new Set<string>(), sources: new Set<string>() };
  const loop = (async () => {
    while (!stopped) {
      const e = (await call(server.url, `/v1/endpoints/${id}`)).body;
      seen.maxInFlight = Math.max(seen.maxInFlight, e.in_flight);
      seen.states.add(e.state);
      seen.sources.add(e.max_concurrency_source);
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  return {
    seen,
    stop: async () => {
      stopped = true;
      await loop;
    },
  };
}

async function retries(reason: string): Promise<number> {
  const text = (await call(server.url, '/metrics')).body as unknown as string;
  const m = new RegExp(`^regen_retries_total\\{reason="${reason}"\\} (\\d+)`, 'm').exec(typeof text === 'string' ? text : '');
  return m ? Number(m[1]) : 0;
}

// The slow-health server's first probe takes its 6.5 s while the scenarios before it run.
let slowHealth: { sim: SimProcess; endpointId: string };

beforeAll(async () => {
  let s: SimProcess;
  [server, s] = await Promise.all([
    startTestServer({ REGEN_LOAD_INTERVAL_MS: '200' }),
    sim({ model: 'm-slowhealth', 'health-ms': 6500, 'max-running': 32, 'ttft-ms': 200, 'tokens-per-second': 500 }),
  ]);
  slowHealth = { sim: s, endpointId: (await registerEndpoint(server.url, s.url)).id };
});

afterAll(async () => {
  await server?.cleanup();
  await Promise.all(sims.map((s) => s.stop()));
  stores.close();
});

describe('regen against real SGLang behaviour', () => {
  it('keeps well over 128 in flight on a default-launched server that runs 256, never more than it runs plus a short queue', async () => {
    // A default launch: top-level max_running_requests is null; the rank says 256. Its answers take
    // about 2 s (300 ms, then 96 tokens at 60 a second): a simulator starved of CPU reads requests
    // late but ends each on the wall clock, so what it runs at once is how fast it reads them times
    // an answer's length. With answers of 0.5 s a loaded machine held it under 128 whatever regen sent.
    const s = await sim({ model: 'm-cap', 'max-running': 256, 'ttft-ms': 300, 'tokens-per-second': 60 });
    const info = (await (await fetch(`${s.url}/server_info`)).json()) as { max_running_requests: unknown };
    expect(info.max_running_requests).toBeNull();
    const ep = await registerEndpoint(server.url, s.url);
    const watch = watchEndpoint(ep.id);
    // Past the adaptive cap's climb from 64 to the server's 256 plus its queue within the first few hundred.
    const { id, prompts } = await run('m-cap', 1200, 'cap');
    const done = await waitForStatus(server.url, id, TERMINAL, 120_000);
    await watch.stop();
    expect(done.status).toBe('completed');
    const stats = await s.stats();
    expect(watch.seen.maxInFlight).toBeGreaterThan(128);
    // And the server held them at once (the answers' length above).
    expect(stats.maxRunningSeen, `regen had ${watch.seen.maxInFlight} in flight`).toBeGreaterThan(128);
    // 256 it can run, plus the low end of its queue band.
    expect(watch.seen.maxInFlight).toBeLessThanOrEqual(serverCeiling(256));
    expect(watch.seen.sources).toContain('adaptive');
    const endpoint = (await call(server.url, `/v1/endpoints/${ep.id}`)).body;
    expect(endpoint.capacity.max_running).toBe(256);
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(1200);
    console.log(
      `sglang capacity: ${JSON.stringify({ server_runs: 256, peak_in_flight: watch.seen.maxInFlight, peak_running_at_server: stats.maxRunningSeen, cap: endpoint.max_concurrency })}`,
    );
  });

  it('admits a server whose /health takes 6.5 s, keeps it ready, and aborts none of its requests', async () => {
    const { sim: s, endpointId } = slowHealth;
    await waitFor(
      'the endpoint to be ready',
      async () => ((await call(server.url, `/v1/endpoints/${endpointId}`)).body.state === 'ready' ? true : undefined),
      30_000,
    );
    const watch = watchEndpoint(endpointId);
    const { id, prompts } = await run('m-slowhealth', 600, 'slowhealth');
    const done = await waitForStatus(server.url, id, TERMINAL, 120_000);
    await watch.stop();
    expect(done.status).toBe('completed');
    expect([...watch.seen.states]).toEqual(['ready']);
    const slow = await s.stats();
    expect(slow.aborted).toBe(0);
    console.log(
      `sglang slow health: ${JSON.stringify({ health_ms: 6500, states: [...watch.seen.states], aborted: slow.aborted, completed: done.request_counts.completed })}`,
    );
    expect((await checkOutput(stores.forUri(done.output_uri), prompts.expected)).lines.size).toBe(600);
  });

  it('never keeps an aborted answer: 5% aborts, every sample completed once with its own answer', async () => {
    const s = await sim({ model: 'm-abort', 'abort-rate': 0.05, 'max-running': 64, 'ttft-ms': 20, 'tokens-per-second': 2000 });
    await registerEndpoint(server.url, s.url);
    const abortsBefore = await retries('aborted');
    const { id, prompts } = await run('m-abort', 2000, 'abort');
    const done = await waitForStatus(server.url, id, TERMINAL, 120_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ completed: 2000, failed: 0 });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(2000);
    for (const line of out.lines.values()) expect(line.finish_reason).not.toBe('abort');
    const sent = (await s.stats()).aborts;
    expect(sent).toBeGreaterThan(50);
    expect((await retries('aborted')) - abortsBefore).toBe(sent);
    console.log(`sglang aborts: ${JSON.stringify({ abort_answers: sent, kept: 0, completed: out.lines.size, failed: done.request_counts.failed })}`);
  });

  it('lets a server given SIGTERM finish what it runs: nothing aborted by regen, nothing lost', async () => {
    const a = await sim({ model: 'm-drain', 'max-running': 64, 'ttft-ms': 1500, 'tokens-per-second': 1000 });
    const b = await sim({ model: 'm-drain', 'max-running': 64, 'ttft-ms': 100, 'tokens-per-second': 1000 });
    const epA = await registerEndpoint(server.url, a.url);
    await registerEndpoint(server.url, b.url);
    const { id, prompts } = await run('m-drain', 1500, 'drain');
    await waitFor('requests running on the draining server', async () => ((await a.stats()).running >= 32 ? true : undefined), 60_000);
    const exited = once(a.proc, 'exit');
    a.proc.kill('SIGTERM');
    // The server exits once idle: regen must stop sending to it while it drains.
    await exited;
    const drained = a.drained();
    expect(drained, 'the drained server printed its final stats').not.toBeNull();
    expect(drained!.aborted).toBe(0);
    expect(drained!.completed).toBeGreaterThanOrEqual(32);
    const done = await waitForStatus(server.url, id, TERMINAL, 120_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ completed: 1500, failed: 0 });
    expect((await checkOutput(stores.forUri(done.output_uri), prompts.expected)).lines.size).toBe(1500);
    // The server is gone: after its probes fail in a row, it is out.
    await waitFor('the drained server to leave rotation', async () =>
      (await call(server.url, `/v1/endpoints/${epA.id}`)).body.state === 'unhealthy' ? true : undefined,
    );
    console.log(
      `sglang drain: ${JSON.stringify({ finished_while_draining: drained!.completed, aborted_by_regen: drained!.aborted, lost: 1500 - done.request_counts.completed })}`,
    );
  });

  it('resumes after an idle pause longer than the 5 s keep-alive without a connection error', async () => {
    const s = await sim({ model: 'm-idle', 'max-running': 16, 'ttft-ms': 50, 'tokens-per-second': 1000 });
    await registerEndpoint(server.url, s.url);
    const before = await retries('connection_error');
    const { id } = await run('m-idle', 400, 'idle');
    await waitFor('some answers', async () => ((await getRun(server.url, id)).request_counts.completed >= 50 ? true : undefined));
    expect((await call(server.url, `/v1/runs/${id}/pause`, { method: 'POST' })).status).toBe(200);
    await waitFor('in-flight requests to finish', async () => ((await getRun(server.url, id)).request_counts.in_progress === 0 ? true : undefined));
    await new Promise((r) => setTimeout(r, 6000));
    expect((await call(server.url, `/v1/runs/${id}/resume`, { method: 'POST' })).status).toBe(200);
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'cancelled'], 60_000);
    expect(done.request_counts).toMatchObject({ completed: 400, failed: 0 });
    expect((await retries('connection_error')) - before).toBe(0);
    expect((await s.stats()).resets).toBe(0);
  });

  it('serves a run whose model a local-path served name stands for, and says why it cannot serve another', async () => {
    const s = await sim({ model: '/models/Qwen3-Sim-7B', 'max-running': 32 });
    await registerEndpoint(server.url, s.url);
    const { id } = await run('Qwen/Qwen3-Sim-7B', 100, 'path', { quality: false });
    expect((await waitForStatus(server.url, id, TERMINAL, 60_000)).status).toBe('completed');
    const other = await run('Org/Unserved-Model', 10, 'unserved');
    const reason = await waitFor('the unserved run to say why it waits', async () => (await getRun(server.url, other.id)).status_reason ?? undefined, 2000);
    expect(reason).toMatch(/no ready endpoint serves model "Org\/Unserved-Model"/);
    expect(reason).toContain('/models/Qwen3-Sim-7B');
    expect((await call(server.url, `/v1/runs/${other.id}/cancel`, { method: 'POST' })).status).toBe(200);
  });

  it('never records a restarted server with another model under the old one', async () => {
    const a = await sim({ model: 'm-swap', 'max-running': 16, 'ttft-ms': 300, 'tokens-per-second': 1000 });
    // Twice as wide: it answers what is left once the first is gone, still for seconds after the other model is up.
    const b = await sim({ model: 'm-swap', 'max-running': 32, 'ttft-ms': 300, 'tokens-per-second': 1000 });
    const epA = await registerEndpoint(server.url, a.url);
    await registerEndpoint(server.url, b.url);
    const { id, prompts } = await run('m-swap', 600, 'swap');
    await waitFor('requests on the first server', async () => ((await a.stats()).running >= 8 ? true : undefined), 60_000);
    a.proc.kill('SIGKILL');
    await once(a.proc, 'exit');
    const swapped = await sim({ model: 'm-other', port: a.port, 'max-running': 16 });
    await waitFor(
      'the endpoint to serve the new model',
      async () => ((await call(server.url, `/v1/endpoints/${epA.id}`)).body.model === 'm-other' ? true : undefined),
      30_000,
    );
    const done = await waitForStatus(server.url, id, TERMINAL, 120_000);
    expect(done.status).toBe('completed');
    const wrong = (await swapped.stats()).requests;
    expect(wrong).toBe(0);
    console.log(`sglang model swap: ${JSON.stringify({ requests_to_the_new_model: wrong, completed: done.request_counts.completed })}`);
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(600);
    for (const line of out.lines.values()) expect(line.model).toBe('m-swap');
  });

  it('fails a prompt plus max_tokens over the context at once, with the server message', async () => {
    const s = await sim({ model: 'm-ctx', 'max-running': 8, 'context-length': 4096 });
    await registerEndpoint(server.url, s.url);
    const { id } = await run('m-ctx', 20, 'ctx', { params: { max_tokens: 8192 } });
    const done = await waitForStatus(server.url, id, TERMINAL, 60_000);
    expect(done.request_counts).toMatchObject({ completed: 0, failed: 20 });
    const samples = await listAllSamples(server.url, id);
    for (const sample of samples) {
      expect(sample.attempts).toBe(1);
      expect(sample.error.code).toBe('invalid_request');
      expect(sample.error.message).toMatch(/maximum context length of 4096/);
    }
  });
});
