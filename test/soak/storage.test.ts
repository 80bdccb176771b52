import { describe, expect, it } from 'vitest';
import { since } from '../support/faults.js';
import { faultRig, preparePrompts, readOutput, s3ServerEnv, waitForEnd, waitForRun } from '../support/fault-rig.js';
import { call } from '../support/server.js';
import { createRun, expectCountersMatchRecount } from '../support/runner-checks.js';

// The soak variant of fault-storage: three 30 s S3 outages during one 10,000-sample run, the last
// one while the run is finalizing (every sample done, shards and manifest still to write).

const BUCKET = 'regen-soak-outage';
const SAMPLES = 10_000;

describe.runIf(process.env.REGEN_SOAK)('soak: repeated S3 outages', () => {
  const rig = faultRig();

  it('rides out each outage and completes with nothing lost', async () => {
    let s3 = await rig.startS3(BUCKET);
    const port = s3.port;
    for (const seed of [1, 2]) await rig.sim({ model: 'm-soak-outage', 'max-running': 16, 'ttft-ms': 100, 'tokens-per-second': 1000, seed });
    const server = await rig.serve(rig.dir('regen-soak-storage-'), s3ServerEnv(s3.url, BUCKET));
    const base = server.url;
    const { prompts, fileId } = await preparePrompts(base, rig.sims, SAMPLES, 'sso');
    const { id } = await createRun(base, { model: 'm-soak-outage', input: { file_id: fileId }, shard_size: 250, regenerate: 'last_assistant' });
    const recoveries: number[] = [];
    // The last outage starts just before the end, so the run finishes dispatching while the store is gone.
    for (const until of [0.2, 0.5, 0.97]) {
      await waitForRun(base, id, `${until * 100}% done`, (r) => r.request_counts.completed >= SAMPLES * until, 600_000, 100);
      await s3.stop();
      await new Promise((r) => setTimeout(r, 30_000));
      expect((await call(base, '/readyz')).status).toBe(503);
      if (until > 0.9) expect((await call(base, `/v1/runs/${id}`)).body.status).toBe('finalizing');
      const before = (await call(base, `/v1/runs/${id}`)).body.shards.uploaded;
      s3 = await rig.startS3(BUCKET, port);
      const t0 = performance.now();
      await waitForRun(base, id, 'an upload after the outage', (r) => r.shards.uploaded > before || r.status === 'completed', 120_000, 100);
      recoveries.push(since(t0));
    }
    const done = await waitForEnd(base, id, 300_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    const out = await readOutput(done, prompts, s3.url);
    expect(out.lines.size).toBe(SAMPLES);
    await expectCountersMatchRecount(base, done);
    expect(server.proc.exitCode).toBeNull();
    console.log(`soak storage: 3 outages of 30 s, first upload after each: ${recoveries.join(', ')} ms`);
  }, 1_200_000);
});
