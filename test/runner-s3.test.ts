import { ListObjectsV2Command } from '@aws-sdk/client-s3';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { makeS3Client } from '../src/storage/s3-store.js';
import { Stores } from '../src/storage/index.js';
import { setEnv } from './support/env.js';
import { call, spawnServer, tempDir, type ServerProcess } from './support/server.js';
import { checkOutput, createRun, expectCountersMatchRecount, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// s3rver ships no types; it is only started and stopped here.
const S3rver = createRequire(import.meta.url)('s3rver');

const BUCKET = 'regen-test';
const PREFIX = 'team/regen/';
const SAMPLES = 1200;
const SHARD_SIZE = 400;
const AWS = { AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER', AWS_REGION: 'us-east-1' };

const s3dir = tempDir('regen-s3rver-');
const data = tempDir('regen-s3-data-');
let s3: any;
let endpoint: string;
const sims: SimProcess[] = [];
let server: ServerProcess | null = null;
let restoreEnv = () => {};

beforeAll(async () => {
  s3 = new S3rver({ address: '127.0.0.1', port: 0, silent: true, directory: s3dir.dir, configureBuckets: [{ name: BUCKET, configs: [] }] });
  const addr = (await s3.run()) as AddressInfo;
  endpoint = `http://127.0.0.1:${addr.port}`;
  // The test reads the bucket with the same SDK and the same standard variables as the server.
  restoreEnv = setEnv(AWS);
  sims.push(await spawnSimulator({ 'ttft-ms': 20, 'tokens-per-second': 2000, 'max-running': 16 }));
  sims.push(await spawnSimulator({ 'ttft-ms': 20, 'tokens-per-second': 2000, 'max-running': 8, seed: 2 }));
});

afterAll(async () => {
  await server?.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  await s3?.close();
  restoreEnv();
  s3dir.cleanup();
  data.cleanup();
});

describe('a run with its input and output in S3', () => {
  it('reads the uploaded file from the bucket and lands shards and manifest there with matching sha256', async () => {
    server = await spawnServer(data.dir, {
      ...AWS,
      REGEN_S3_ENDPOINT: endpoint,
      REGEN_S3_FORCE_PATH_STYLE: 'true',
      REGEN_OUTPUT_URI: `s3://${BUCKET}/${PREFIX}`,
    });
    const ready = await call(server.url, '/readyz');
    expect(ready.status).toBe(200);
    for (const s of sims) await registerEndpoint(server.url, s.url);

    const prompts = makePrompts(SAMPLES, 's3');
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const stores = new Stores({ endpoint, forcePathStyle: true });
    const bucketRoot = stores.forUri(`s3://${BUCKET}/${PREFIX}`);
    expect((await bucketRoot.get(`files/${fileId}.jsonl`)).toString('utf8')).toBe(prompts.jsonl);

    // A few "OK." answers are kept (flagged, not re-asked) and fixed later by a retry, which has to
    // read the shards' other lines back from the bucket.
    for (const s of sims) await s.configure({ degenerateRate: 0.02 });
    const { id } = await createRun(server.url, {
      model: 'sim-model',
      input: { file_id: fileId },
      shard_size: SHARD_SIZE,
      regenerate: 'last_assistant',
      params: { chat_template_kwargs: { enable_thinking: true } },
      quality: { retry_flagged: 0, gate: false },
    });
    const first = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(first.status).toBe('completed');
    expect(first.quality.flagged).toBeGreaterThan(0);
    expect(first.quality.by_flag.missing_reasoning).toBe(first.quality.flagged);
    const firstManifest = JSON.parse((await stores.forUri(first.output_uri).get('manifest.json')).toString('utf8'));
    expect(firstManifest.quality.flagged).toBe(first.quality.flagged);

    for (const s of sims) await s.configure({ degenerateRate: 0 });
    const retried = await call(server.url, `/v1/runs/${id}/retry`, { method: 'POST', json: { only: 'flagged' } });
    expect(retried.status).toBe(200);
    expect(retried.body.request_counts.pending).toBe(first.quality.flagged);
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    expect(done.quality.flagged).toBe(0);
    expect(done.output_uri).toBe(`s3://${BUCKET}/${PREFIX}runs/${id}/`);
    expect(done.manifest_uri).toBe(`s3://${BUCKET}/${PREFIX}runs/${id}/manifest.json`);
    expect(done.shards).toEqual({ total: 3, uploaded: 3 });

    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(SAMPLES);
    expect(out.errors.size).toBe(0);
    expect(out.manifest.output_uri).toBe(done.output_uri);
    expect(out.manifest.quality.flagged).toBe(0);

    // Exactly the shards and the manifest are under the run's prefix: no leftovers, no errors files.
    const client = makeS3Client({ endpoint, forcePathStyle: true });
    const listed = await client.send(new ListObjectsV2Command({ Bucket: BUCKET, Prefix: `${PREFIX}runs/${id}/` }));
    client.destroy();
    const keys = (listed.Contents ?? []).map((o) => o.Key!.slice(`${PREFIX}runs/${id}/`.length)).sort();
    expect(keys).toEqual(['manifest.json', 'shard-00000.jsonl', 'shard-00001.jsonl', 'shard-00002.jsonl']);
    const sizes = Object.fromEntries((listed.Contents ?? []).map((o) => [o.Key!.split('/').pop(), o.Size]));
    for (const s of out.manifest.shards) expect(sizes[s.key]).toBe(s.bytes);

    // Samples read back from the uploaded shard in the bucket.
    const sample = await call(server.url, `/v1/runs/${id}/samples/s3-11`);
    expect(sample.body.output.content).toBe(out.lines.get('s3-11').content);
    await expectCountersMatchRecount(server.url, done);
    stores.close();
  });
});
