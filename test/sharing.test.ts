import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { createRun, getRun, listAllSamples, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';
import { call, startTestServer, waitFor } from './support/server.js';

// Sharing a server with others' traffic (README "Sharing servers"): regen marks its requests as
// bulk, stops sending a priority the server refuses, and takes a server's turning it away as the
// server's choice: the samples go back with nothing charged and the endpoint backs off.

const ENDED = ['completed', 'failed', 'cancelled'];
/** Turn-aways this far apart belong to two rounds of tries: one round's all come back within a few polls. */
const ROUND_GAP_MS = 150;

let server: Awaited<ReturnType<typeof startTestServer>>;
let sim: SimProcess;

beforeAll(async () => {
  sim = await spawnSimulator({ 'max-running': 16, 'ttft-ms': 5, 'tokens-per-second': 2000, seed: 39 });
  // Three tries a sample at most: a turn-away that was charged would fail samples here.
  server = await startTestServer({ REGEN_MAX_SERVER_FAULTS: '3', REGEN_REQUEST_RETRY_MS: '50' });
});

afterAll(async () => {
  await server?.cleanup();
  await sim?.stop();
});

afterEach(async () => {
  await sim.configure({ turnAwayRate: 0, retryAfterSeconds: 0, refusePriority: 0, enablePriorityScheduling: 0, tokensPerSecond: 2000 });
  for (const e of (await call(server.url, '/v1/endpoints')).body.data) await call(server.url, `/v1/endpoints/${e.id}`, { method: 'DELETE' });
});

async function run(n: number, tag: string): Promise<any> {
  const prompts = makePrompts(n, tag);
  return createRun(server.url, {
    model: 'sim-model',
    input: { file_id: await uploadFile(server.url, prompts.jsonl) },
    regenerate: 'last_assistant',
    quality: false,
  });
}

/** Every sample answered, each sent once as far as its budgets know: no attempt and no server fault charged. */
async function expectNothingCharged(runId: string, n: number): Promise<void> {
  const samples = await listAllSamples(server.url, runId);
  expect(samples).toHaveLength(n);
  expect(samples.filter((s) => s.status !== 'completed')).toEqual([]);
  expect(samples.filter((s) => s.attempts !== 1 || s.server_faults !== 0).map((s) => [s.attempts, s.server_faults])).toEqual([]);
}

const metric = (text: string, name: string, labels: string): number => {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && labels.split(',').every((l2) => l.includes(l2)));
  return line ? Number(line.split(' ').pop()) : 0;
};

describe('marking regen as bulk', () => {
  it("sends the endpoint's priority and the gateway's bulk header on every request", async () => {
    const before = await sim.stats();
    await registerEndpoint(server.url, sim.url, { request_priority: -1, bulk_header: true });
    const r = await run(30, 'mark');
    expect((await waitForStatus(server.url, r.id, ENDED)).status).toBe('completed');
    const after = await sim.stats();
    const sent = after.requests - before.requests;
    expect(sent).toBe(30);
    expect(after.prioritized - before.prioritized).toBe(sent);
    expect(after.bulk - before.bulk).toBe(sent);
  });

  it('stops sending a priority the server refuses, says so on the endpoint, and asks again with nothing charged', async () => {
    await sim.configure({ refusePriority: 1 });
    const before = await sim.stats();
    const ep = await registerEndpoint(server.url, sim.url, { request_priority: -1 });
    expect(ep.priority_refused_at).toBeNull();
    const r = await run(40, 'refused');
    expect((await waitForStatus(server.url, r.id, ENDED)).status).toBe('completed');
    await expectNothingCharged(r.id, 40);
    const after = await sim.stats();
    // Only the requests sent before the first refusal came back carried it; none after.
    expect(after.priorityRefused - before.priorityRefused).toBeGreaterThan(0);
    expect(after.prioritized - before.prioritized).toBe(after.priorityRefused - before.priorityRefused);
    const shown = (await call(server.url, `/v1/endpoints/${ep.id}`)).body;
    expect(shown.priority_refused_at).not.toBeNull();
    expect(shown.request_priority).toBe(-1);
    // Setting the priority again tries it again (the server may have been relaunched with it).
    const patched = await call(server.url, `/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { request_priority: -2 } });
    expect(patched.body.priority_refused_at).toBeNull();
  });
});

describe('a server turning regen away', () => {
  it('429s and preempted bulk requests cost no attempt: the run completes with nothing lost, each counted by endpoint and reason', async () => {
    await sim.configure({ turnAwayRate: 0.3 });
    const before = await sim.stats();
    const bulk = await registerEndpoint(server.url, sim.url, { bulk_header: true });
    const r = await run(60, 'shed');
    expect((await waitForStatus(server.url, r.id, ENDED)).status).toBe('completed');
    await expectNothingCharged(r.id, 60);
    const turned = (await sim.stats()).turnedAway - before.turnedAway;
    expect(turned).toBeGreaterThan(0);
    const metrics = (await call(server.url, '/metrics')).body as string;
    await waitFor('the turn-aways counted', async () => {
      const text = (await call(server.url, '/metrics')).body as string;
      return metric(text, 'regen_turned_away_total', `endpoint_id="${bulk.id}",reason="preempted"`) === turned ? true : undefined;
    });
    expect(metric(metrics, 'regen_retries_total', 'reason="server_error"')).toBe(0);
  });

  it('a server that turns everything away with Retry-After: the run says all endpoints are busy, then goes on when it lets regen in', async () => {
    await sim.configure({ turnAwayRate: 1, retryAfterSeconds: 2 });
    const ep = await registerEndpoint(server.url, sim.url);
    const r = await run(20, 'busy');
    const waiting = await waitFor('the run to say why it waits', async () => {
      const got = await getRun(server.url, r.id);
      return got.status_reason?.includes('all endpoints are busy with other traffic') ? got : undefined;
    });
    expect(waiting.status_reason).toBe('waiting for an endpoint: all endpoints are busy with other traffic');
    // Retry-After is honoured: two seconds between rounds of tries, not the 50 ms of the request backoff.
    const rises: number[] = [];
    let last = 0;
    const gap = await waitFor(
      'a second round of tries',
      async () => {
        const now = (await sim.stats()).turnedAway;
        if (now > last) rises.push(Date.now());
        last = now;
        const next = rises.findIndex((t, i) => i > 0 && t - rises[i - 1] > ROUND_GAP_MS);
        return next > 0 ? rises[next] - rises[next - 1] : undefined;
      },
      30_000,
      20,
    );
    expect(gap).toBeGreaterThanOrEqual(1800);
    await sim.configure({ turnAwayRate: 0 });
    expect((await waitForStatus(server.url, r.id, ENDED)).status).toBe('completed');
    await expectNothingCharged(r.id, 20);
    const done = await getRun(server.url, r.id);
    expect(done.status_reason ?? null).toBeNull();
    expect((await call(server.url, `/v1/endpoints/${ep.id}`)).body.state).toBe('ready');
  });
});

describe('a server preempting regen for people', () => {
  it("SGLang's priority preemption shows only as latency: the run completes with nothing charged", async () => {
    // Answers of about a third of a second, so that people's requests meet a full batch of regen's.
    await sim.configure({ enablePriorityScheduling: 1, tokensPerSecond: 200 });
    const before = await sim.stats();
    await registerEndpoint(server.url, sim.url, { request_priority: -11 });
    const r = await run(300, 'preempted');
    // People's requests at priority 0, a few at a time, until one has pushed one of regen's out.
    let people = 0;
    await waitFor(
      'a preemption',
      async () => {
        const answers = await Promise.all(
          Array.from({ length: 4 }, () =>
            fetch(`${sim.url}/v1/chat/completions`, {
              method: 'POST',
              body: JSON.stringify({ messages: [{ role: 'user', content: `a person asks ${people++}` }], priority: 0, max_tokens: 4 }),
            }),
          ),
        );
        for (const a of answers) expect(a.status).toBe(200);
        return (await sim.stats()).preempted > before.preempted ? true : undefined;
      },
      60_000,
      0,
    );
    expect((await waitForStatus(server.url, r.id, ENDED)).status).toBe('completed');
    await expectNothingCharged(r.id, 300);
    const metrics = (await call(server.url, '/metrics')).body as string;
    expect(metric(metrics, 'regen_retries_total', 'reason="server_error"')).toBe(0);
  });
});
