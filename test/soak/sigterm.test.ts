import { describe, expect, it } from 'vitest';
import { since } from '../support/faults.js';
import { allSent, faultRig, preparePrompts, readOutput, simTotals, SLOW_SIM, waitForEnd } from '../support/fault-rig.js';
import { waitFor, type ServerProcess } from '../support/server.js';
import { createRun, expectCountersMatchRecount, getRun } from '../support/runner-checks.js';

// The soak variant of fault-sigterm: SIGTERM and restart every few seconds, each time with hundreds
// of slow requests in flight, through a 6,000-sample run.

const SAMPLES = 6000;
const MODEL = 'm-soak-term';

describe.runIf(process.env.REGEN_SOAK)('soak: SIGTERM over and over', () => {
  const rig = faultRig();

  it('exits 0 each time, and the run asks each prompt exactly once', async () => {
    const data = rig.dir('regen-soak-term-');
    for (const seed of [1, 2]) await rig.sim({ model: MODEL, ...SLOW_SIM, seed });
    const env = { REGEN_SHUTDOWN_GRACE_MS: '15000' };
    let server: ServerProcess = await rig.serve(data, env);
    const { prompts, fileId } = await preparePrompts(server.url, rig.sims, SAMPLES, 'sst');
    const { id } = await createRun(server.url, { model: MODEL, input: { file_id: fileId }, shard_size: 200, regenerate: 'last_assistant' });
    const exits: number[] = [];
    for (;;) {
      const url = server.url;
      const busy = await waitFor(
        'requests in flight',
        async () => {
          if (allSent(await getRun(url, id))) return false;
          return (await simTotals(rig.sims)).running >= 200 ? true : undefined;
        },
        120_000,
        50,
      );
      if (!busy) break;
      const t0 = performance.now();
      expect(await server.kill('SIGTERM')).toBe(0);
      exits.push(since(t0));
      expect((await simTotals(rig.sims)).aborted).toBe(0);
      server = await rig.serve(data, env);
    }
    const done = await waitForEnd(server.url, id, 300_000);
    expect(done.status).toBe('completed');
    const out = await readOutput(done, prompts);
    expect(out.lines.size).toBe(SAMPLES);
    expect((await simTotals(rig.sims)).requests).toBe(SAMPLES);
    await expectCountersMatchRecount(server.url, done);
    expect(exits.length).toBeGreaterThan(3);
    console.log(`soak sigterm: ${exits.length} drains, exit times ${exits.join(', ')} ms`);
  }, 1_200_000);
});
