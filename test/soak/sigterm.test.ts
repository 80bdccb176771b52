import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from '../../src/sim/spawn.js';
import { Stores } from '../../src/storage/index.js';
import { since } from '../support/faults.js';
import { spawnServer, tempDir, waitFor, type ServerProcess } from '../support/server.js';
import { checkOutput, createRun, expectCountersMatchRecount, getRun, makePrompts, registerEndpoint, uploadFile, waitForStatus } from '../support/runner-checks.js';

// The soak variant of fault-sigterm: SIGTERM and restart every few seconds, each time with hundreds
// of slow requests in flight, through a 6,000-sample run.

const SAMPLES = 6000;
const MODEL = 'm-soak-term';

/** Validated, and nothing left waiting to be sent (the run's total is 0 while it validates). */
const allSent = (run: any) => run.request_counts.total > 0 && run.request_counts.pending === 0;

describe.runIf(process.env.REGEN_SOAK)('soak: SIGTERM over and over', () => {
  const data = tempDir('regen-soak-term-');
  const sims: SimProcess[] = [];
  let server: ServerProcess | null = null;

  afterAll(async () => {
    await server?.kill('SIGKILL');
    await Promise.all(sims.map((s) => s.stop()));
    data.cleanup();
  });

  it('exits 0 each time, and the run asks each prompt exactly once', async () => {
    for (const seed of [1, 2]) sims.push(await spawnSimulator({ model: MODEL, 'max-running': 200, 'ttft-ms': 2000, 'tokens-per-second': 10_000, seed }));
    const env = { REGEN_SHUTDOWN_GRACE_MS: '15000' };
    server = await spawnServer(data.dir, env);
    for (const s of sims) await registerEndpoint(server.url, s.url);
    const prompts = makePrompts(SAMPLES, 'sst');
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const { id } = await createRun(server.url, { model: MODEL, input: { file_id: fileId }, shard_size: 200, regenerate: 'last_assistant' });
    const exits: number[] = [];
    for (;;) {
      const running = async () => (await Promise.all(sims.map((s) => s.stats()))).reduce((t, s) => t + s.running, 0);
      const url = server.url;
      const busy = await waitFor('requests in flight', async () => {
        if (allSent(await getRun(url, id))) return false;
        return (await running()) >= 200 ? true : undefined;
      }, 120_000, 50);
      if (!busy) break;
      const t0 = performance.now();
      expect(await server.kill('SIGTERM')).toBe(0);
      exits.push(since(t0));
      expect((await Promise.all(sims.map((s) => s.stats()))).reduce((t, s) => t + s.aborted, 0)).toBe(0);
      server = await spawnServer(data.dir, env);
    }
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled'], 300_000);
    expect(done.status).toBe('completed');
    const stores = new Stores({ forcePathStyle: false });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    expect((await Promise.all(sims.map((s) => s.stats()))).reduce((t, s) => t + s.requests, 0)).toBe(SAMPLES);
    await expectCountersMatchRecount(server.url, done);
    expect(exits.length).toBeGreaterThan(3);
    console.log(`soak sigterm: ${exits.length} drains, exit times ${exits.join(', ')} ms`);
  }, 1_200_000);
});
