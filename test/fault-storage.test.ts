import { renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { Stores } from '../src/storage/index.js';
import { S3RVER_AWS, since, startS3, type S3Server } from './support/faults.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { checkOutput, createRun, expectCountersMatchRecount, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// The object store goes away mid-run: s3rver stopped for 30 s, and a local output folder that can
// no longer be written. Tests run as root, where chmod 0555 does not stop a write, so the folder
// is replaced by a plain file: every write under it fails with ENOTDIR whoever the user is.

const sims: SimProcess[] = [];
const servers: ServerProcess[] = [];
const dirs: { cleanup(): void }[] = [];
const savedEnv = { ...process.env };
let s3: S3Server | null = null;

afterAll(async () => {
  for (const s of servers) await s.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  await s3?.stop().catch(() => {});
  process.env = savedEnv;
  for (const d of dirs) d.cleanup();
});

function dir(prefix: string): string {
  const d = tempDir(prefix);
  dirs.push(d);
  return d.dir;
}

async function sim(model: string): Promise<SimProcess> {
  const s = await spawnSimulator({ model, 'max-running': 8, 'ttft-ms': 60, 'tokens-per-second': 1000 });
  sims.push(s);
  return s;
}

const doneOf = (run: any) => run.request_counts.completed + run.request_counts.failed + run.request_counts.cancelled;

async function shardsOf(base: string, id: string): Promise<any[]> {
  return (await call(base, `/v1/runs/${id}/shards?limit=1000`)).body.data;
}

describe('object store faults', () => {
  it('an S3 outage of 30 s: shards wait, upload once it is back, and the run completes with nothing lost', async () => {
    const BUCKET = 'regen-outage';
    const SAMPLES = 2000;
    const s3dir = dir('regen-s3rver-outage-');
    s3 = await startS3(s3dir, BUCKET);
    const port = s3.port;
    Object.assign(process.env, S3RVER_AWS);
    const s = await sim('m-outage');
    const server = await spawnServer(dir('regen-outage-'), {
      ...S3RVER_AWS,
      REGEN_S3_ENDPOINT: s3.url,
      REGEN_S3_FORCE_PATH_STYLE: 'true',
      REGEN_OUTPUT_URI: `s3://${BUCKET}/regen/`,
    });
    servers.push(server);
    const base = server.url;
    expect((await call(base, '/readyz')).status).toBe(200);
    await registerEndpoint(base, s.url);
    const prompts = makePrompts(SAMPLES, 'so');
    const fileId = await uploadFile(base, prompts.jsonl);
    const { id } = await createRun(base, { model: 'm-outage', input: { file_id: fileId }, shard_size: 100, regenerate: 'last_assistant' });
    const before = await waitFor('a few shards uploaded', async () => {
      const r = (await call(base, `/v1/runs/${id}`)).body;
      return r.shards.uploaded >= 2 ? r : undefined;
    });

    await s3.stop();
    const tDown = performance.now();
    const down = await waitFor('/readyz to report the object store', async () => {
      const r = await call(base, '/readyz');
      return r.status === 503 ? r : undefined;
    }, 20_000);
    expect(down.body).toMatchObject({ status: 'unavailable', checks: { database: 'ok', object_store: 'unavailable' } });
    // Shards that close meanwhile fail to upload, say why on the shard, and are retried.
    const failing = await waitFor('a shard upload to fail', async () => {
      const open = (await shardsOf(base, id)).filter((x) => x.status === 'open' && x.upload_attempts > 0);
      return open.length ? open : undefined;
    }, 25_000);
    expect(failing[0].last_error).toMatch(/^upload failed: .*connection refused.*; retrying/);
    const remaining = 30_000 - since(tDown);
    if (remaining > 0) await new Promise((r) => setTimeout(r, remaining));
    const duringOutage = (await call(base, `/v1/runs/${id}`)).body;
    expect((await call(base, '/healthz')).status).toBe(200);
    expect(duringOutage.shards.uploaded).toBe(before.shards.uploaded);
    expect(doneOf(duringOutage)).toBeGreaterThan(doneOf(before));
    const outageMs = since(tDown);

    s3 = await startS3(s3dir, BUCKET, port);
    const tUp = performance.now();
    await waitFor('/readyz 200 again', async () => ((await call(base, '/readyz')).status === 200 ? true : undefined), 30_000);
    const readyAfterMs = since(tUp);
    await waitFor('the shards that waited to be uploaded', async () => {
      const r = (await call(base, `/v1/runs/${id}`)).body;
      return r.shards.uploaded > duringOutage.shards.uploaded ? true : undefined;
    }, 30_000);
    const firstUploadAfterMs = since(tUp);
    const done = await waitForStatus(base, id, ['completed', 'failed', 'paused', 'cancelled']);
    const completedAfterMs = since(tUp);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    expect(done.shards).toEqual({ total: SAMPLES / 100, uploaded: SAMPLES / 100 });
    const shards = await shardsOf(base, id);
    expect(shards.every((x) => x.last_error === null)).toBe(true);
    const retriedShards = shards.filter((x) => x.upload_attempts > 0).length;
    expect(retriedShards).toBeGreaterThan(0);

    const stores = new Stores({ endpoint: s3.url, forcePathStyle: true });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    await expectCountersMatchRecount(base, done);
    // The process rode it out: one listening line, no crash.
    expect(server.proc.exitCode).toBeNull();
    console.log(
      'fault-storage s3:',
      JSON.stringify({ samples: SAMPLES, outage_ms: outageMs, done_during_outage: doneOf(duringOutage) - doneOf(before), retried_shards: retriedShards, ready_after_ms: readyAfterMs, first_upload_after_ms: firstUploadAfterMs, completed_after_ms: completedAfterMs }),
    );
  });

  it('a local output folder that cannot be written: a clear error on the shards, /readyz 503, no crash, recovery', async () => {
    const SAMPLES = 1500;
    const data = dir('regen-readonly-');
    const s = await sim('m-readonly');
    const server = await spawnServer(data);
    servers.push(server);
    const base = server.url;
    await registerEndpoint(base, s.url);
    const prompts = makePrompts(SAMPLES, 'ro');
    const fileId = await uploadFile(base, prompts.jsonl);
    const { id } = await createRun(base, { model: 'm-readonly', input: { file_id: fileId }, shard_size: 100, regenerate: 'last_assistant' });
    const before = await waitFor('a shard uploaded', async () => {
      const r = (await call(base, `/v1/runs/${id}`)).body;
      return r.shards.uploaded >= 1 ? r : undefined;
    });

    const objects = join(data, 'objects');
    renameSync(objects, `${objects}.away`);
    writeFileSync(objects, 'not a folder');
    const tBroken = performance.now();
    const down = await waitFor('/readyz 503', async () => {
      const r = await call(base, '/readyz');
      return r.status === 503 ? r : undefined;
    }, 10_000);
    expect(down.body.checks.object_store).toBe('unavailable');
    const failing = await waitFor('a shard upload to fail', async () => {
      const open = (await shardsOf(base, id)).filter((x) => x.status === 'open' && x.upload_attempts > 0);
      return open.length ? open : undefined;
    }, 30_000);
    expect(failing[0].last_error).toMatch(/^upload failed: not a directory \(ENOTDIR\); retrying/);
    // No server path in what the API says.
    expect(JSON.stringify(failing)).not.toContain(data);
    await new Promise((r) => setTimeout(r, 8000));
    expect((await call(base, '/healthz')).status).toBe(200);
    const during = (await call(base, `/v1/runs/${id}`)).body;
    expect(during.shards.uploaded).toBe(before.shards.uploaded);
    const brokenMs = since(tBroken);

    rmSync(objects);
    renameSync(`${objects}.away`, objects);
    const tFixed = performance.now();
    await waitFor('/readyz 200 again', async () => ((await call(base, '/readyz')).status === 200 ? true : undefined), 10_000);
    await waitFor('the shards that waited to be uploaded', async () => {
      const r = (await call(base, `/v1/runs/${id}`)).body;
      return r.shards.uploaded > during.shards.uploaded ? true : undefined;
    }, 30_000);
    const firstUploadAfterMs = since(tFixed);
    const done = await waitForStatus(base, id, ['completed', 'failed', 'paused', 'cancelled']);
    const completedAfterMs = since(tFixed);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    const stores = new Stores({ forcePathStyle: false });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    await expectCountersMatchRecount(base, done);
    expect(server.proc.exitCode).toBeNull();
    // Each failure was logged as a warning with the shard, never as a crash.
    expect(server.output()).toMatch(/"msg":"shard upload failed"/);
    expect(server.output()).not.toMatch(/uncaught|unhandled/i);
    console.log('fault-storage local:', JSON.stringify({ samples: SAMPLES, broken_ms: brokenMs, failed_uploads: failing.length, first_upload_after_ms: firstUploadAfterMs, completed_after_ms: completedAfterMs, left_at_fix: SAMPLES - doneOf(during) }));
  });
});
