import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from '../../src/sim/spawn.js';
import { Stores } from '../../src/storage/index.js';
import { S3RVER_AWS, since, startS3, type S3Server } from '../support/faults.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from '../support/server.js';
import { checkOutput, createRun, expectCountersMatchRecount, makePrompts, registerEndpoint, uploadFile, waitForStatus } from '../support/runner-checks.js';

// The soak variant of fault-storage: three 30 s S3 outages during one 10,000-sample run, the last
// one while the run is finalizing (every sample done, shards and manifest still to write).

const BUCKET = 'regen-soak-outage';
const SAMPLES = 10_000;

describe.runIf(process.env.REGEN_SOAK)('soak: repeated S3 outages', () => {
  const s3dir = tempDir('regen-soak-s3rver-');
  const data = tempDir('regen-soak-storage-');
  const sims: SimProcess[] = [];
  let s3: S3Server | null = null;
  let server: ServerProcess | null = null;
  const savedEnv = { ...process.env };

  afterAll(async () => {
    await server?.kill('SIGKILL');
    await Promise.all(sims.map((s) => s.stop()));
    await s3?.stop().catch(() => {});
    process.env = savedEnv;
    s3dir.cleanup();
    data.cleanup();
  });

  it('rides out each outage and completes with nothing lost', async () => {
    s3 = await startS3(s3dir.dir, BUCKET);
    const port = s3.port;
    Object.assign(process.env, S3RVER_AWS);
    for (const seed of [1, 2]) sims.push(await spawnSimulator({ model: 'm-soak-outage', 'max-running': 16, 'ttft-ms': 100, 'tokens-per-second': 1000, seed }));
    server = await spawnServer(data.dir, { ...S3RVER_AWS, REGEN_S3_ENDPOINT: s3.url, REGEN_S3_FORCE_PATH_STYLE: 'true', REGEN_OUTPUT_URI: `s3://${BUCKET}/regen/` });
    const base = server.url;
    for (const s of sims) await registerEndpoint(base, s.url);
    const prompts = makePrompts(SAMPLES, 'sso');
    const fileId = await uploadFile(base, prompts.jsonl);
    const { id } = await createRun(base, { model: 'm-soak-outage', input: { file_id: fileId }, shard_size: 250, regenerate: 'last_assistant' });
    const recoveries: number[] = [];
    // The last outage starts just before the end, so the run finishes dispatching while the store is gone.
    for (const until of [0.2, 0.5, 0.97]) {
      await waitFor(`${until * 100}% done`, async () => {
        const r = (await call(base, `/v1/runs/${id}`)).body;
        return r.request_counts.completed >= SAMPLES * until ? true : undefined;
      }, 600_000, 100);
      await s3.stop();
      await new Promise((r) => setTimeout(r, 30_000));
      expect((await call(base, '/readyz')).status).toBe(503);
      if (until > 0.9) expect((await call(base, `/v1/runs/${id}`)).body.status).toBe('finalizing');
      const before = (await call(base, `/v1/runs/${id}`)).body.shards.uploaded;
      s3 = await startS3(s3dir.dir, BUCKET, port);
      const t0 = performance.now();
      await waitFor('an upload after the outage', async () => {
        const r = (await call(base, `/v1/runs/${id}`)).body;
        return r.shards.uploaded > before || r.status === 'completed' ? true : undefined;
      }, 120_000, 100);
      recoveries.push(since(t0));
    }
    const done = await waitForStatus(base, id, ['completed', 'failed', 'paused', 'cancelled'], 300_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    const stores = new Stores({ endpoint: s3.url, forcePathStyle: true });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    await expectCountersMatchRecount(base, done);
    expect(server.proc.exitCode).toBeNull();
    console.log(`soak storage: 3 outages of 30 s, first upload after each: ${recoveries.join(', ')} ms`);
  }, 1_200_000);
});
