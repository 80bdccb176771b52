import { describe, expect, it } from 'vitest';
import type { Hold } from '../support/faults.js';
import { allSent, doneOf, faultRig, preparePrompts, readOutput, s3ServerEnv, waitForEnd } from '../support/fault-rig.js';
import type { ServerProcess } from '../support/server.js';
import { createRun, expectCountersMatchRecount, getRun } from '../support/runner-checks.js';

// The soak variant of fault-crash-s3: a 20,000-sample run SIGKILLed over and over, each time at the
// next of three points (requests in flight, inside a shard PUT, between a PUT and its check),
// until it completes; then at both manifest points. `npm run soak` runs it.

const BUCKET = 'regen-soak-crash';
const SAMPLES = 20_000;
const SHARD_SIZE = 500;

describe.runIf(process.env.REGEN_SOAK)('soak: SIGKILL of an S3-writing server, over and over', () => {
  const rig = faultRig();

  it('completes with every prompt exactly once', async () => {
    const { s3, proxy } = await rig.startHeldS3(BUCKET);
    for (const seed of [1, 2, 3]) await rig.sim({ 'ttft-ms': 150, 'tokens-per-second': 1000, 'max-running': 16, seed });
    const data = rig.dir('regen-soak-crash-');
    const env = s3ServerEnv(proxy.url, BUCKET);
    let server: ServerProcess = await rig.serve(data, env);
    const { prompts, fileId } = await preparePrompts(server.url, rig.sims, SAMPLES, 'soak');
    const { id } = await createRun(server.url, { model: 'sim-model', input: { file_id: fileId }, shard_size: SHARD_SIZE, regenerate: 'last_assistant' });
    const kills: string[] = [];
    const restart = async (point: string) => {
      const seen = await getRun(server.url, id);
      await server.kill('SIGKILL');
      kills.push(`${point}@${doneOf(seen)}`);
      server = await rig.serve(data, env);
    };
    /** Waits for a held request, or for the run to settle first (then there is nothing left to hold). */
    const arrivedOrSettled = async (hold: Hold) => {
      let arrived = false;
      void hold.arrived.then(() => (arrived = true));
      for (;;) {
        if (arrived) return true;
        if (allSent(await getRun(server.url, id))) return arrived;
        await new Promise((r) => setTimeout(r, 100));
      }
    };

    for (let cycle = 0; ; cycle++) {
      const run = await getRun(server.url, id);
      if (allSent(run)) break;
      await new Promise((r) => setTimeout(r, 1000 + Math.random() * 3000));
      const point = ['in flight', 'shard PUT', 'shard check'][cycle % 3];
      if (point === 'in flight') {
        if ((await getRun(server.url, id)).request_counts.in_progress === 0) continue;
        await restart(point);
        continue;
      }
      const hold = proxy.hold(point === 'shard PUT' ? 'PUT' : 'GET', /\/shard-\d{5}\.jsonl$/);
      const held = await arrivedOrSettled(hold);
      if (!held) {
        hold.release();
        break;
      }
      await restart(point);
    }
    for (const [method, point] of [
      ['PUT', 'manifest PUT'],
      ['GET', 'manifest check'],
    ] as const) {
      const hold = proxy.hold(method, /\/manifest\.json$/);
      await hold.arrived;
      await restart(point);
    }

    const done = await waitForEnd(server.url, id, 600_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    const out = await readOutput(done, prompts, s3.url);
    expect(out.lines.size).toBe(SAMPLES);
    expect([...out.lines.values()].every((l) => l.attempts === 1)).toBe(true);
    await expectCountersMatchRecount(server.url, done);
    console.log(`soak crash-s3: ${kills.length} kills: ${kills.join(', ')}`);
    expect(kills.length).toBeGreaterThan(8);
  }, 1_200_000);
});
