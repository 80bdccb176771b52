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
import { startTestServer, waitFor } from './support/server.js';

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
