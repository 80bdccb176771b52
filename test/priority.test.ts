import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { doneOf } from './support/fault-rig.js';
import {
  checkOutput,
  createRun,
  expectCountersMatchRecount,
  getRun,
  makePrompts,
  registerEndpoint,
  uploadFile,
  waitForStatus,
} from './support/runner-checks.js';
import { call, startTestServer, waitFor } from './support/server.js';

// Runs go by priority, then age (README "How a run behaves"): a run of higher priority takes the
// slots of the endpoints that serve it as they free, ahead of a run already under way.

const CAP = 6;
const LOW = 1500;
const HIGH = 600;

let server: Awaited<ReturnType<typeof startTestServer>>;
const sims: SimProcess[] = [];

beforeAll(async () => {
  for (const seed of [31, 32]) sims.push(await spawnSimulator({ 'max-running': 64, 'ttft-ms': 30, 'tokens-per-second': 3000, seed }));
  server = await startTestServer();
});

afterAll(async () => {
  await server?.cleanup();
  await Promise.all(sims.map((s) => s.stop()));
});

describe('runs of different priority on one fleet', () => {
  it('a run of higher priority for another model takes the slots as they free, and the one under way waits for it', async () => {
    const base = server.url;
    // Both endpoints serve both models (a second served name): the runs want the same slots.
    for (const sim of sims) await registerEndpoint(base, sim.url, { max_concurrency: CAP, aliases: ['other-model'] });
    const low = makePrompts(LOW, 'low');
    const high = makePrompts(HIGH, 'high');
    const lowRun = await createRun(base, { model: 'sim-model', input: { file_id: await uploadFile(base, low.jsonl) }, regenerate: 'last_assistant' });
    await waitFor('the low-priority run 10% done', async () => (doneOf(await getRun(base, lowRun.id)) >= 0.1 * LOW ? true : undefined), 120_000, 50);
    const highRun = await createRun(base, {
      model: 'other-model',
      priority: 10,
      input: { file_id: await uploadFile(base, high.jsonl) },
      regenerate: 'last_assistant',
    });

    let lowAtStart: number | null = null;
    const lowAtAnswered = await waitFor(
      'the high-priority run answered',
      async () => {
        const [l, h] = await Promise.all([getRun(base, lowRun.id), getRun(base, highRun.id)]);
        if (lowAtStart === null && h.status !== 'validating' && h.status !== 'queued') lowAtStart = l.request_counts.completed;
        if (doneOf(h) < HIGH) return undefined;
        expect(l.status, 'the low-priority run is still under way').toBe('in_progress');
        return l.request_counts.completed as number;
      },
      120_000,
      50,
    );
    expect(lowAtStart, 'the high-priority run was seen under way').not.toBeNull();
    // What the low run had in flight or claimed ahead when the high one arrived, and the slots the
    // high one's last samples leave, at most a few dozen. Sharing the slots, it would answer about
    // as many as the high run's 600 meanwhile (a third of them when each refill of the high run
    // handed it the slots that freed while the claim ran).
    const lowMeanwhile = lowAtAnswered - lowAtStart!;
    console.log(`priority: ${JSON.stringify({ low_meanwhile: lowMeanwhile, high: HIGH, slots: CAP * sims.length })}`);
    expect(lowMeanwhile).toBeLessThanOrEqual(0.15 * HIGH);

    const stores = new Stores({ forcePathStyle: false });
    try {
      for (const [run, prompts, n] of [
        [lowRun, low, LOW],
        [highRun, high, HIGH],
      ] as const) {
        const done = await waitForStatus(base, run.id, ['completed', 'failed', 'paused', 'cancelled']);
        expect(done.status, done.status_reason).toBe('completed');
        expect(done.request_counts).toMatchObject({ total: n, completed: n, failed: 0 });
        await expectCountersMatchRecount(base, done);
        expect((await checkOutput(stores.forUri(done.output_uri), prompts.expected)).lines.size).toBe(n);
      }
    } finally {
      stores.close();
    }
    for (const sim of sims) expect((await sim.stats()).maxRunningSeen).toBeLessThanOrEqual(CAP);
  }, 300_000);
});

describe('a run queued behind another', () => {
  it('says which run it waits behind while that one holds the slots, and drops the reason once it runs', async () => {
    const base = server.url;
    // One request a second, two at a time: the run ahead lasts minutes unless cancelled.
    const slow = await spawnSimulator({ model: 'queue-model', 'ttft-ms': 10, 'tokens-per-second': 20, 'completion-tokens': 20, seed: 33 });
    try {
      await registerEndpoint(base, slow.url, { max_concurrency: 2 });
      const input = (n: number, tag: string) => ({ requests: Array.from({ length: n }, (_, i) => ({ custom_id: `${tag}-${i}`, prompt: `${tag} ${i}` })) });
      const ahead = await createRun(base, { name: 'the long one', model: 'queue-model', priority: 5, input: input(300, 'ahead') });
      await waitForStatus(base, ahead.id, ['in_progress']);
      const behind = await createRun(base, { model: 'queue-model', input: input(4, 'behind') });
      const waiting = await waitFor('the queued run to say why it waits', async () => {
        const r = await getRun(base, behind.id);
        return r.status_reason ? r : undefined;
      });
      expect(waiting.status).toBe('queued');
      expect(waiting.status_reason).toBe(
        `waiting behind run ${ahead.id} ("the long one"), ahead of it in the order (priority 5, then age): it holds the slots of the endpoints serving model "queue-model"`,
      );
      expect((await call(base, `/v1/runs/${ahead.id}/cancel`, { method: 'POST', json: {} })).status).toBe(200);
      const done = await waitForStatus(base, behind.id, ['completed']);
      expect(done.status_reason).toBeNull();
    } finally {
      await slow.stop();
    }
  }, 120_000);
});
