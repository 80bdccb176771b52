import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, spawnServer, startTestServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { checkOutput, createRun, getRun, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// Quality gate 2 where its work lives in the store, so on both stores: a quarantine asks the broken
// server's flagged answers again in one transaction (requeueRunSamples), and the quality window a
// restarted process judges by is read back from the samples (recentCompleted).

const TERMINAL = ['completed', 'failed', 'cancelled', 'paused'];
const THINKING = { chat_template_kwargs: { enable_thinking: true } };
let server: Awaited<ReturnType<typeof startTestServer>>;
const sims: SimProcess[] = [];
const stores = new Stores({ forcePathStyle: false });

async function sim(flags: Record<string, string | number>): Promise<SimProcess> {
  const s = await spawnSimulator({ 'ttft-ms': 20, 'tokens-per-second': 4000, 'max-running': 16, ...flags });
  sims.push(s);
  return s;
}

async function run(model: string, n: number, tag: string, extra: Record<string, unknown> = {}) {
  const prompts = makePrompts(n, tag);
  const fileId = await uploadFile(server.url, prompts.jsonl);
  const created = await createRun(server.url, { model, input: { file_id: fileId }, regenerate: 'last_assistant', shard_size: 500, ...extra });
  return { id: created.id as string, prompts };
}

beforeAll(async () => {
  server = await startTestServer();
});

afterAll(async () => {
  await server?.cleanup();
  await Promise.all(sims.map((s) => s.stop()));
  stores.close();
});

describe('quality gate 2', () => {
  it('quarantines the one broken server of five, asks its flagged answers again elsewhere, and completes clean', async () => {
    const good = await Promise.all([1, 2, 3, 4].map((seed) => sim({ model: 'g-five', seed })));
    const bad = await sim({ model: 'g-five', 'degenerate-rate': 0.87, seed: 9 });
    for (const s of good) await registerEndpoint(server.url, s.url);
    const badEp = await registerEndpoint(server.url, bad.url);
    const { id, prompts } = await run('g-five', 4000, 'five', { params: THINKING });
    const done = await waitForStatus(server.url, id, TERMINAL, 120_000);
    expect(done.status, done.status_reason).toBe('completed');
    const ep = (await call(server.url, `/v1/endpoints/${badEp.id}`)).body;
    expect(ep.state).toBe('quarantined');
    expect(ep.last_error).toMatch(/^quality gate: endpoint /);
    expect(ep.last_error).toMatch(/missing_reasoning|duplicate_content|empty_content/);
    const answeredByBad = (await bad.stats()).completed;
    expect(answeredByBad).toBeLessThan(400);
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(4000);
    const flagged = [...out.lines.values()].filter((l) => l.flags.length > 0).length;
    expect(flagged / out.lines.size).toBeLessThan(0.01);
    const metrics = (await call(server.url, '/metrics')).body as unknown as string;
    expect(metrics).toContain(`regen_endpoint_state{endpoint_id="${badEp.id}",state="quarantined"} 1`);
    console.log(`gate five endpoints: ${JSON.stringify({ answers_from_the_broken_one: answeredByBad, flagged_in_output: flagged, total: out.lines.size })}`);

    // Put back by an operator: probed, and it takes work again, under watch.
    expect((await call(server.url, `/v1/endpoints/${badEp.id}`, { method: 'PATCH', json: { state: 'ready' } })).status).toBe(200);
    await waitFor('the endpoint back in rotation', async () =>
      (await call(server.url, `/v1/endpoints/${badEp.id}`)).body.state === 'ready' ? true : undefined,
    );
  });
});

describe('quality gate 2 across a crash', () => {
  const data = tempDir('regen-gate-crash-');
  let proc: ServerProcess | null = null;
  let s: SimProcess;

  afterAll(async () => {
    await proc?.kill('SIGKILL');
    await s?.stop();
    data.cleanup();
  });

  it('still pauses within 400 samples of the turn when the server is killed -9 in between', async () => {
    [s, proc] = await Promise.all([
      // The healthy samples come fast; from the turn on, answers slow down so the kill lands among the first bad ones.
      spawnSimulator({ model: 'g-crash', 'ttft-ms': 5, 'tokens-per-second': 40_000, 'max-running': 16, seed: 12 }),
      spawnServer(data.dir),
    ]);
    await registerEndpoint(proc.url, s.url);
    const prompts = makePrompts(6000, 'crash');
    const fileId = await uploadFile(proc.url, prompts.jsonl);
    const { id } = await createRun(proc.url, { model: 'g-crash', input: { file_id: fileId }, regenerate: 'last_assistant', params: THINKING });
    const completed = async (url: string) => (await getRun(url, id)).request_counts.completed as number;
    const first = proc.url;
    await waitFor('2,000 healthy samples', async () => ((await completed(first)) >= 2000 ? true : undefined), 90_000, 20);
    // Slower now, so that the process dies with some bad answers in and the decision still to come.
    await s.configure({ degenerateRate: 0.87, ttftMs: 150, tokensPerSecond: 4000 });
    const atTurn = await getRun(first, id);
    const turnedAt = atTurn.request_counts.completed as number;
    // Bad answers committed, not only healthy ones that were still in flight or in the writer's buffer at the turn.
    const atKill = await waitFor(
      'the first bad answers',
      async () => {
        const r = await getRun(first, id);
        return r.request_counts.completed >= turnedAt + 40 && r.quality.flagged > atTurn.quality.flagged ? r : undefined;
      },
      60_000,
      10,
    );
    await proc.kill('SIGKILL');
    expect(atKill.status).toBe('in_progress');
    proc = await spawnServer(data.dir);
    const paused = await waitForStatus(proc.url, id, TERMINAL, 90_000);
    expect(paused.status).toBe('paused');
    expect(paused.status_reason).toMatch(/^quality gate: /);
    const after = paused.request_counts.completed - turnedAt;
    expect(after).toBeLessThanOrEqual(400);
    console.log(`gate late turn across kill -9: ${JSON.stringify({ healthy: turnedAt, samples_after_the_turn: after })}`);
  });
});
