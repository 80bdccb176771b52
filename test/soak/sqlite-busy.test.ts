import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from '../../src/sim/spawn.js';
import { Stores } from '../../src/storage/index.js';
import { holdWriteLock } from '../support/faults.js';
import { spawnServer, tempDir, type ServerProcess } from '../support/server.js';
import { checkOutput, createRun, expectCountersMatchRecount, getRun, makePrompts, registerEndpoint, uploadFile, waitForStatus } from '../support/runner-checks.js';

// The soak variant of fault-sqlite-busy: a 15,000-sample run with a 250 ms busy_timeout while
// another process takes the write lock for 1–4 s every few seconds, until the run is done.

const SAMPLES = 15_000;
const MODEL = 'm-soak-busy';

/** Validated, and nothing left waiting to be sent (the run's total is 0 while it validates). */
const allSent = (run: any) => run.request_counts.total > 0 && run.request_counts.pending === 0;

describe.runIf(process.env.REGEN_SOAK)('soak: SQLITE_BUSY all run long', () => {
  const data = tempDir('regen-soak-busy-');
  const sims: SimProcess[] = [];
  let server: ServerProcess | null = null;

  afterAll(async () => {
    await server?.kill('SIGKILL');
    await Promise.all(sims.map((s) => s.stop()));
    data.cleanup();
  });

  it('loses nothing, asks nothing twice and never crashes', async () => {
    for (const seed of [1, 2]) sims.push(await spawnSimulator({ model: MODEL, 'max-running': 16, 'ttft-ms': 100, 'tokens-per-second': 1000, seed }));
    server = await spawnServer(data.dir, { REGEN_DB_BUSY_TIMEOUT_MS: '250' });
    const pid = server.proc.pid;
    for (const s of sims) await registerEndpoint(server.url, s.url);
    const prompts = makePrompts(SAMPLES, 'ssb');
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const { id } = await createRun(server.url, { model: MODEL, input: { file_id: fileId }, shard_size: 500, regenerate: 'last_assistant' });
    let locks = 0;
    while (!allSent(await getRun(server.url, id))) {
      await new Promise((r) => setTimeout(r, 2000 + Math.random() * 3000));
      const lock = holdWriteLock(join(data.dir, 'regen.db'), 1000 + Math.random() * 3000);
      await lock.released;
      locks++;
    }
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled'], 300_000);
    expect(done.status).toBe('completed');
    expect(server.proc.pid).toBe(pid);
    expect(server.proc.exitCode).toBeNull();
    const stores = new Stores({ forcePathStyle: false });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    expect((await Promise.all(sims.map((s) => s.stats()))).reduce((t, s) => t + s.requests, 0)).toBe(SAMPLES);
    await expectCountersMatchRecount(server.url, done);
    const busy = server.output().split('\n').filter((l) => /SQLITE_BUSY|database is locked/.test(l)).length;
    expect(busy).toBeGreaterThan(locks);
    console.log(`soak sqlite-busy: ${locks} locks, ${busy} refused writes, ${done.progress.elapsed_seconds} s`);
  }, 1_200_000);
});
