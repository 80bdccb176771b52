import { once } from 'node:events';
import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { since } from './support/faults.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import {
  checkOutput,
  createRun,
  DEAD_ENDPOINT_ERROR,
  expectCountersMatchRecount,
  makePrompts,
  registerEndpoint,
  uploadFile,
  waitForStatus,
} from './support/runner-checks.js';

// A pool where everything goes wrong at once: two servers answering 10% 500/503, dropping 5% of
// connections and hanging 1% of requests (the run's request_timeout_ms must cut those), one server
// that dies for good mid-run, and one that crashes and comes back on the same port.

const SAMPLES = 1500;
const FLAKY = { 'error-rate': 0.1, 'reset-rate': 0.05, 'hang-rate': 0.01 };
const LATENCY = { 'ttft-ms': 150, 'tokens-per-second': 1000 };
const MODEL = 'm-faults';

const data = tempDir('regen-fault-endpoints-');
const sims: SimProcess[] = [];
let server: ServerProcess | null = null;

async function sim(flags: Record<string, string | number>): Promise<SimProcess> {
  const s = await spawnSimulator({ model: MODEL, ...LATENCY, ...flags });
  sims.push(s);
  return s;
}

afterAll(async () => {
  await server?.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  data.cleanup();
});

const doneOf = (run: any) => run.request_counts.completed + run.request_counts.failed + run.request_counts.cancelled;

describe('endpoint faults during a run', () => {
  it('completes every sample through errors, resets, hangs, a dead server and one that comes back', async () => {
    const flaky = [await sim({ ...FLAKY, 'max-running': 16, seed: 3 }), await sim({ ...FLAKY, 'max-running': 16, seed: 4 })];
    const dying = await sim({ 'max-running': 8, 'die-after': 200 });
    let returning = await sim({ 'max-running': 8 });
    server = await spawnServer(data.dir);
    const base = server.url;
    const eps: any[] = [];
    for (const s of [...flaky, dying, returning]) eps.push(await registerEndpoint(base, s.url));
    const [epDying, epReturning] = [eps[2].id, eps[3].id];
    const state = async (id: string) => (await call(base, `/v1/endpoints/${id}`)).body.state as string;
    await waitFor('all four endpoints ready', async () => ((await Promise.all(eps.map((e) => state(e.id)))).every((s) => s === 'ready') ? true : undefined));

    const prompts = makePrompts(SAMPLES, 'ef');
    const fileId = await uploadFile(base, prompts.jsonl);
    const { id } = await createRun(base, {
      model: MODEL,
      input: { file_id: fileId },
      shard_size: 250,
      regenerate: 'last_assistant',
      request_timeout_ms: 2000,
      max_attempts: 30,
    });

    // The returning server crashes once the run is well under way.
    await waitFor('10% done', async () => (doneOf((await call(base, `/v1/runs/${id}`)).body) >= SAMPLES * 0.1 ? true : undefined));
    const port = returning.port;
    const exited = once(returning.proc, 'exit');
    returning.proc.kill('SIGKILL');
    await exited;
    const tDown = performance.now();
    await waitFor('the crashed endpoint to be unhealthy', async () => ((await state(epReturning)) === 'unhealthy' ? true : undefined), 30_000);
    const unhealthyAfterMs = since(tDown);
    // The run goes on without it, its probes failing and backing off, before it comes back.
    const atUnhealthy = doneOf((await call(base, `/v1/runs/${id}`)).body);
    await waitFor('progress without the crashed endpoint', async () =>
      doneOf((await call(base, `/v1/runs/${id}`)).body) >= atUnhealthy + SAMPLES * 0.05 ? true : undefined,
    );

    // A new process on the same port: the same registered endpoint, so no new registration.
    returning = await sim({ 'max-running': 8, port });
    const tUp = performance.now();
    await waitFor('the endpoint to be ready again', async () => ((await state(epReturning)) === 'ready' ? true : undefined), 60_000);
    const readmittedAfterMs = since(tUp);
    const runAtReadmission = (await call(base, `/v1/runs/${id}`)).body;
    expect(doneOf(runAtReadmission)).toBeLessThan(SAMPLES);
    await waitFor('the returned server to get work', async () => ((await returning.stats()).completed > 0 ? true : undefined), 30_000);

    const done = await waitForStatus(base, id, ['completed', 'failed', 'paused', 'cancelled'], 110_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });

    // Every fault really happened.
    const stats = await Promise.all(flaky.map((s) => s.stats()));
    const sum = (k: string) => stats.reduce((t, s) => t + s[k], 0);
    expect(sum('errors')).toBeGreaterThan(0);
    expect(sum('resets')).toBeGreaterThan(0);
    expect(sum('hangs')).toBeGreaterThan(0);
    expect(dying.proc.exitCode).toBe(1);
    // A hang is only ever ended by the request timeout: the retries say so.
    const metrics = (await call(base, '/metrics')).body as string;
    const retries = (reason: string) => Number(new RegExp(`^regen_retries_total\\{reason="${reason}"\\} (\\d+)`, 'm').exec(metrics)?.[1] ?? 0);
    expect(retries('timeout')).toBeGreaterThan(0);
    expect(retries('server_error')).toBeGreaterThan(0);
    expect(retries('connection_error')).toBeGreaterThan(0);

    // The dead server stays out, the returned one and the flaky ones are in rotation.
    expect(await state(epDying)).toBe('unhealthy');
    expect(await state(epReturning)).toBe('ready');
    await waitFor(
      'the flaky endpoints ready',
      async () => ((await Promise.all(eps.slice(0, 2).map((e) => state(e.id)))).every((s) => s === 'ready') ? true : undefined),
      30_000,
    );
    const dead = (await call(base, `/v1/endpoints/${epDying}`)).body;
    expect(dead.last_error).toMatch(DEAD_ENDPOINT_ERROR);
    expect(dead.in_flight).toBe(0);

    const stores = new Stores({ forcePathStyle: false });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    expect(out.errors.size).toBe(0);
    const byEndpoint = (ep: string) => [...out.lines.values()].filter((l) => l.endpoint_id === ep).length;
    expect(byEndpoint(epReturning)).toBeGreaterThan(0);
    expect(byEndpoint(epDying)).toBeLessThan(200);
    await expectCountersMatchRecount(base, done);

    const attempts = [...out.lines.values()].map((l) => l.attempts);
    console.log(
      'fault-endpoints:',
      JSON.stringify({
        samples: SAMPLES,
        injected: { errors: sum('errors'), resets: sum('resets'), hangs: sum('hangs') },
        retries: { timeout: retries('timeout'), server_error: retries('server_error'), connection_error: retries('connection_error') },
        max_attempts_used: Math.max(...attempts),
        retried_samples: attempts.filter((a) => a > 1).length,
        unhealthy_after_ms: unhealthyAfterMs,
        readmitted_after_ms: readmittedAfterMs,
        answered_by_returned: byEndpoint(epReturning),
        answered_by_dying: byEndpoint(epDying),
        elapsed_s: done.progress.elapsed_seconds,
      }),
    );
  });
});
