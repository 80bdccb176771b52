import { once } from 'node:events';
import { describe, expect, it } from 'vitest';
import { allSent, faultRig, preparePrompts, readOutput, waitForEnd } from '../support/fault-rig.js';
import { call, waitFor } from '../support/server.js';
import { createRun, expectCountersMatchRecount } from '../support/runner-checks.js';

// The soak variant of fault-endpoints: 20,000 samples over flaky servers while, every few seconds,
// one of two other servers crashes and comes back on its port, until the run is done.

const SAMPLES = 20_000;
const MODEL = 'm-soak-eps';
const FLAKY = { 'error-rate': 0.1, 'reset-rate': 0.05, 'hang-rate': 0.01 };

describe.runIf(process.env.REGEN_SOAK)('soak: endpoints failing and returning for a whole run', () => {
  const rig = faultRig();
  const sim = (flags: Record<string, string | number>) => rig.sim({ model: MODEL, 'ttft-ms': 100, 'tokens-per-second': 1000, 'max-running': 16, ...flags });

  it('completes every sample, and every endpoint ends ready', async () => {
    for (const seed of [3, 4]) await sim({ ...FLAKY, seed });
    const bouncing = [await sim({ seed: 5 }), await sim({ seed: 6 })];
    const server = await rig.serve(rig.dir('regen-soak-eps-'));
    const base = server.url;
    const { prompts, fileId, endpoints: eps } = await preparePrompts(base, rig.sims, SAMPLES, 'se');
    const { id } = await createRun(base, {
      model: MODEL,
      input: { file_id: fileId },
      shard_size: 1000,
      regenerate: 'last_assistant',
      request_timeout_ms: 2000,
      max_attempts: 50,
    });

    let bounces = 0;
    for (let i = 0; ; i++) {
      await new Promise((r) => setTimeout(r, 5000));
      const run = (await call(base, `/v1/runs/${id}`)).body;
      if (allSent(run)) break;
      const k = i % 2;
      const port = bouncing[k].port;
      const exited = once(bouncing[k].proc, 'exit');
      bouncing[k].proc.kill('SIGKILL');
      await exited;
      await new Promise((r) => setTimeout(r, 1000 + Math.random() * 4000));
      bouncing[k] = await sim({ seed: 7 + i, port });
      bounces++;
    }

    const done = await waitForEnd(base, id, 600_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    await waitFor(
      'every endpoint ready',
      async () => {
        const states = await Promise.all(eps.map(async (e) => (await call(base, `/v1/endpoints/${e.id}`)).body.state));
        return states.every((s) => s === 'ready') ? true : undefined;
      },
      120_000,
      500,
    );
    const out = await readOutput(done, prompts);
    expect(out.lines.size).toBe(SAMPLES);
    await expectCountersMatchRecount(base, done);
    console.log(`soak endpoints: ${SAMPLES} samples, ${bounces} crash-and-return cycles, ${done.progress.elapsed_seconds} s`);
  }, 1_200_000);
});
