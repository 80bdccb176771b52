import { ListObjectsV2Command } from '@aws-sdk/client-s3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { makeS3Client } from '../src/storage/s3-store.js';
import { Stores } from '../src/storage/index.js';
import { HoldingProxy, S3RVER_AWS, since, startS3, type S3Server } from './support/faults.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { checkOutput, createRun, expectCountersMatchRecount, getRun, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// SIGKILL of a server writing to S3 at each dangerous moment: while it reads the input
// (validating), with requests in flight, in the middle of a shard's PUT, between a shard's PUT and
// its read-back, during the manifest's PUT and between that PUT and the run becoming completed.
// A proxy in front of s3rver holds the one request a kill should land in, so each point is hit
// exactly, not by luck.

const BUCKET = 'regen-crash';
const SAMPLES = 3000;
const SHARD_SIZE = 200;
const LATENCY = { 'ttft-ms': 30, 'tokens-per-second': 1000 };

const s3dir = tempDir('regen-s3rver-crash-');
const data = tempDir('regen-crash-s3-');
const sims: SimProcess[] = [];
let s3: S3Server;
let proxy: HoldingProxy;
let server: ServerProcess | null = null;
const savedEnv = { ...process.env };

beforeAll(async () => {
  s3 = await startS3(s3dir.dir, BUCKET);
  proxy = await new HoldingProxy({ host: '127.0.0.1', port: s3.port }).start();
  Object.assign(process.env, S3RVER_AWS);
  sims.push(await spawnSimulator({ ...LATENCY, 'max-running': 16, seed: 1 }));
  sims.push(await spawnSimulator({ ...LATENCY, 'max-running': 8, seed: 2 }));
});

afterAll(async () => {
  await server?.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  await proxy?.close();
  await s3?.stop();
  process.env = savedEnv;
  s3dir.cleanup();
  data.cleanup();
});

const env = () => ({
  ...S3RVER_AWS,
  REGEN_S3_ENDPOINT: proxy.url,
  REGEN_S3_FORCE_PATH_STYLE: 'true',
  REGEN_OUTPUT_URI: `s3://${BUCKET}/regen/`,
});
const doneOf = (run: any) => run.request_counts.completed + run.request_counts.failed + run.request_counts.cancelled;

describe('SIGKILL of a server writing to S3', () => {
  it('at every step of a run, and the output still has each prompt exactly once', async () => {
    server = await spawnServer(data.dir, env());
    for (const s of sims) await registerEndpoint(server.url, s.url);
    const prompts = makePrompts(SAMPLES, 'k');
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const kills: { point: string; status: string; done: number; inFlight: number; uploaded: number }[] = [];
    const recoveries: { point: string; listeningMs: number; progressMs: number }[] = [];

    /** SIGKILLs the server now, noting where the run was; restarts it and times the way back. */
    const killAndRestart = async (point: string, id: string, waitProgress = true) => {
      const seen = await getRun(server!.url, id);
      await server!.kill('SIGKILL');
      kills.push({ point, status: seen.status, done: doneOf(seen), inFlight: seen.request_counts.in_progress, uploaded: seen.shards.uploaded });
      const t0 = performance.now();
      server = await spawnServer(data.dir, env());
      const listeningMs = since(t0);
      const url = server.url;
      // Back to work: a sample or a shard more than at the kill (or the run finished).
      if (waitProgress) {
        await waitFor(`progress after the kill ${point}`, async () => {
          const r = (await call(url, `/v1/runs/${id}`)).body;
          return doneOf(r) > doneOf(seen) || r.shards.uploaded > seen.shards.uploaded || r.status === 'completed' ? r : undefined;
        }, 60_000, 50);
      }
      recoveries.push({ point, listeningMs, progressMs: since(t0) });
      return seen;
    };

    // 1. While validating: the input's GET from the bucket is held, so ingestion is mid-read.
    const inputRead = proxy.hold('GET', new RegExp(`/files/${fileId}\\.jsonl$`));
    const { id } = await createRun(server.url, { model: 'sim-model', input: { file_id: fileId }, shard_size: SHARD_SIZE, regenerate: 'last_assistant' });
    await inputRead.arrived;
    expect((await killAndRestart('validating', id)).status).toBe('validating');

    // 2. Mid-dispatch, with requests in flight.
    const url2 = server.url;
    await waitFor('30% done with requests in flight', async () => {
      const r = (await call(url2, `/v1/runs/${id}`)).body;
      return doneOf(r) >= 0.3 * SAMPLES && r.request_counts.in_progress > 0 ? r : undefined;
    }, 90_000, 50);
    expect((await killAndRestart('in flight', id)).status).toBe('in_progress');

    // 3. In the middle of a shard's PUT: the object never reaches the bucket.
    const shardPut = proxy.hold('PUT', /\/shard-\d{5}\.jsonl$/);
    await shardPut.arrived;
    await killAndRestart('during a shard PUT', id);

    // 4. After a shard's PUT, before its read-back and its uploaded mark: the object is there, the database does not know.
    const shardCheck = proxy.hold('GET', /\/shard-\d{5}\.jsonl$/);
    await shardCheck.arrived;
    await killAndRestart('between a shard PUT and its check', id);

    // 5. During the manifest's PUT, with every shard uploaded.
    const manifestPut = proxy.hold('PUT', /\/manifest\.json$/);
    await manifestPut.arrived;
    const atManifest = await killAndRestart('during the manifest PUT', id, false);
    expect(atManifest.status).toBe('finalizing');
    expect(atManifest.shards.uploaded).toBe(SAMPLES / SHARD_SIZE);

    // 6. The manifest is in the bucket; the run is not yet completed.
    const manifestCheck = proxy.hold('GET', /\/manifest\.json$/);
    await manifestCheck.arrived;
    expect((await killAndRestart('between the manifest PUT and completed', id, false)).status).toBe('finalizing');

    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    expect(done.shards).toEqual({ total: SAMPLES / SHARD_SIZE, uploaded: SAMPLES / SHARD_SIZE });
    // Each kill from step 2 on cut into a live dispatch or upload.
    expect(kills[1].inFlight).toBeGreaterThan(0);

    // Read the bucket directly, not through the proxy.
    const stores = new Stores({ endpoint: s3.url, forcePathStyle: true });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    expect(out.errors.size).toBe(0);
    expect(out.manifest.run.status).toBe('completed');
    expect(out.manifest.counts).toEqual({ total: SAMPLES, completed: SAMPLES, failed: 0, cancelled: 0 });
    // A crash is not held against a sample: nothing here failed, so every line took one attempt.
    expect([...out.lines.values()].filter((l) => l.attempts !== 1).map((l) => l.custom_id)).toEqual([]);
    await expectCountersMatchRecount(server.url, done);

    // Exactly the shards and the manifest under the run's prefix: a killed PUT leaves nothing half-written.
    const client = makeS3Client({ endpoint: s3.url, forcePathStyle: true });
    const prefix = `regen/runs/${id}/`;
    const listed = await client.send(new ListObjectsV2Command({ Bucket: BUCKET, Prefix: prefix }));
    client.destroy();
    const keys = (listed.Contents ?? []).map((o) => o.Key!.slice(prefix.length)).sort();
    expect(keys).toEqual(['manifest.json', ...out.manifest.shards.map((s: any) => s.key)].sort());

    console.log('fault-crash-s3: kills', JSON.stringify(kills), 'recoveries', JSON.stringify(recoveries));
  });
});
