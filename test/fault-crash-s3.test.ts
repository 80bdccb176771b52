import { ListObjectsV2Command } from '@aws-sdk/client-s3';
import { describe, expect, it } from 'vitest';
import { makeS3Client } from '../src/storage/s3-store.js';
import { since } from './support/faults.js';
import { doneOf, faultRig, preparePrompts, readOutput, s3ServerEnv, waitForEnd, waitForRun } from './support/fault-rig.js';
import type { ServerProcess } from './support/server.js';
import { createRun, expectCountersMatchRecount, getRun } from './support/runner-checks.js';

// SIGKILL of a server writing to S3 at each dangerous moment: while it reads the input
// (validating), with requests in flight, in the middle of a shard's PUT, between a shard's PUT and
// its read-back, during the manifest's PUT and between that PUT and the run becoming completed.
// A proxy in front of s3rver holds the one request a kill should land in, so each point is hit
// exactly, not by luck.

const BUCKET = 'regen-crash';
const SAMPLES = 1500;
const SHARD_SIZE = 100;
const LATENCY = { 'ttft-ms': 30, 'tokens-per-second': 1000 };

const rig = faultRig();

describe('SIGKILL of a server writing to S3', () => {
  it('at every step of a run, and the output still has each prompt exactly once', async () => {
    const { s3, proxy } = await rig.startHeldS3(BUCKET);
    await rig.sim({ ...LATENCY, 'max-running': 16, seed: 1 });
    await rig.sim({ ...LATENCY, 'max-running': 8, seed: 2 });
    const data = rig.dir('regen-crash-s3-');
    const env = s3ServerEnv(proxy.url, BUCKET);
    let server: ServerProcess = await rig.serve(data, env);
    const { prompts, fileId } = await preparePrompts(server.url, rig.sims, SAMPLES, 'k');
    const kills: { point: string; status: string; done: number; inFlight: number; uploaded: number }[] = [];
    const recoveries: { point: string; listeningMs: number; progressMs: number }[] = [];

    /** SIGKILLs the server now, noting where the run was; restarts it and times the way back. */
    const killAndRestart = async (point: string, id: string, waitProgress = true) => {
      const seen = await getRun(server.url, id);
      await server.kill('SIGKILL');
      kills.push({ point, status: seen.status, done: doneOf(seen), inFlight: seen.request_counts.in_progress, uploaded: seen.shards.uploaded });
      const t0 = performance.now();
      server = await rig.serve(data, env);
      const listeningMs = since(t0);
      // Back to work: a sample or a shard more than at the kill (or the run finished).
      if (waitProgress) {
        const progressed = (r: any) => doneOf(r) > doneOf(seen) || r.shards.uploaded > seen.shards.uploaded || r.status === 'completed';
        await waitForRun(server.url, id, `progress after the kill ${point}`, progressed, 60_000, 50);
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
    await waitForRun(server.url, id, '30% done with requests in flight', (r) => doneOf(r) >= 0.3 * SAMPLES && r.request_counts.in_progress > 0, 90_000, 50);
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

    const done = await waitForEnd(server.url, id);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    expect(done.shards).toEqual({ total: SAMPLES / SHARD_SIZE, uploaded: SAMPLES / SHARD_SIZE });
    // Each kill from step 2 on cut into a live dispatch or upload.
    expect(kills[1].inFlight).toBeGreaterThan(0);

    // Read the bucket directly, not through the proxy.
    const out = await readOutput(done, prompts, s3.url);
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
