import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { holdWriteLock } from '../support/faults.js';
import { allSent, faultRig, preparePrompts, readOutput, simTotals, waitForEnd } from '../support/fault-rig.js';
import { createRun, expectCountersMatchRecount, getRun } from '../support/runner-checks.js';

// The soak variant of fault-sqlite-busy: a 15,000-sample run with a 250 ms busy_timeout while
// another process takes the write lock for 1–4 s every few seconds, until the run is done.

const SAMPLES = 15_000;
const MODEL = 'm-soak-busy';

describe.runIf(process.env.REGEN_SOAK)('soak: SQLITE_BUSY all run long', () => {
  const rig = faultRig();

  it('loses nothing, asks nothing twice and never crashes', async () => {
    const data = rig.dir('regen-soak-busy-');
    for (const seed of [1, 2]) await rig.sim({ model: MODEL, 'max-running': 16, 'ttft-ms': 100, 'tokens-per-second': 1000, seed });
    const server = await rig.serve(data, { REGEN_DB_BUSY_TIMEOUT_MS: '250' });
    const pid = server.proc.pid;
    const { prompts, fileId } = await preparePrompts(server.url, rig.sims, SAMPLES, 'ssb');
    const { id } = await createRun(server.url, { model: MODEL, input: { file_id: fileId }, shard_size: 500, regenerate: 'last_assistant' });
    let locks = 0;
    while (!allSent(await getRun(server.url, id))) {
      await new Promise((r) => setTimeout(r, 2000 + Math.random() * 3000));
      const lock = holdWriteLock(join(data, 'regen.db'), 1000 + Math.random() * 3000);
      await lock.released;
      locks++;
    }
    const done = await waitForEnd(server.url, id, 300_000);
    expect(done.status).toBe('completed');
    expect(server.proc.pid).toBe(pid);
    expect(server.proc.exitCode).toBeNull();
    const out = await readOutput(done, prompts);
    expect(out.lines.size).toBe(SAMPLES);
    expect((await simTotals(rig.sims)).requests).toBe(SAMPLES);
    await expectCountersMatchRecount(server.url, done);
    const busy = server
      .output()
      .split('\n')
      .filter((l) => /SQLITE_BUSY|database is locked/.test(l)).length;
    expect(busy).toBeGreaterThan(locks);
    console.log(`soak sqlite-busy: ${locks} locks, ${busy} refused writes, ${done.progress.elapsed_seconds} s`);
  }, 1_200_000);
});
