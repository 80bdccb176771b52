import type { ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { since } from './support/faults.js';
import { doneOf, faultRig, preparePrompts, readOutput, s3ServerEnv, waitForEnd, waitForReadyz, waitForRun } from './support/fault-rig.js';
import { call, waitFor } from './support/server.js';
import { createRun, expectCountersMatchRecount } from './support/runner-checks.js';

// The object store goes away mid-run: s3rver stopped, and a local output folder that can no longer
// be written. Tests run as root, where chmod 0555 does not stop a write, so the folder is replaced
// by a plain file: every write under it fails with ENOTDIR whoever the user is. Each fault lasts
// until uploads have failed and been retried and failed again, the run still answering meanwhile:
// what a longer outage adds is only more of the same backoff.

const rig = faultRig();

/** Short store retries (250 ms, then 500 ms, 1 s…): the retries of an outage take a second or two, not the default's 2 s, 4 s, 8 s. */
const STORE_RETRY = { REGEN_STORE_RETRY_MS: '250' };
const sim = (model: string) => rig.sim({ model, 'max-running': 16, 'ttft-ms': 60, 'tokens-per-second': 1000 });
/** Small shards: many of them close, and fail to upload, while the store is away. */
const SHARD_SIZE = 40;

/**
 * Runs `swap` while the server's process is stopped (SIGSTOP, every thread of it seen stopped in
 * /proc, then SIGCONT). Swapping the folder and the file takes two steps, and between them the
 * path is free: a retried upload that made the folder again there (it creates what is missing)
 * once made the folder's return fail with ENOTEMPTY.
 */
async function whileStopped(proc: ChildProcess, swap: () => void): Promise<void> {
  const pid = proc.pid!;
  // The state letter follows the command's closing parenthesis; T: stopped by a signal.
  const stopped = () => readdirSync(`/proc/${pid}/task`).every((t) => readFileSync(`/proc/${pid}/task/${t}/stat`, 'utf8').split(') ').pop()!.startsWith('T'));
  proc.kill('SIGSTOP');
  try {
    await waitFor('the server to stop', () => (stopped() ? true : undefined), 10_000, 5);
    swap();
  } finally {
    proc.kill('SIGCONT');
  }
}

async function shardsOf(base: string, id: string): Promise<any[]> {
  return (await call(base, `/v1/runs/${id}/shards?limit=1000`)).body.data;
}

/** Shards that closed while the store was away: still open, with `attempts` failed uploads behind them at least. */
function waitForFailedUploads(base: string, id: string, ms: number, attempts = 1): Promise<any[]> {
  return waitFor(
    `a shard upload to fail ${attempts} time(s)`,
    async () => {
      const open = (await shardsOf(base, id)).filter((x) => x.status === 'open' && x.upload_attempts >= attempts);
      return open.length ? open : undefined;
    },
    ms,
  );
}

/** The shards open and closed now, with their failed uploads: those that may have an upload under way. */
async function uploadable(base: string, id: string): Promise<Map<number, number>> {
  return new Map((await shardsOf(base, id)).filter((x) => x.status === 'open' && x.done === x.samples).map((x) => [x.index, x.upload_attempts]));
}

/**
 * The run, read once every shard of `before` (uploadable() just before the store went away, and
 * just after) has ended an upload since (uploaded, or one more failed attempt): an upload begun
 * before the fault may have stored its files then and mark its shard later, but none is still
 * under way by then. Only those shards can have had one: a shard closed later was first tried with
 * the store away.
 */
async function uploadedOnceSettled(base: string, id: string, before: Map<number, number>): Promise<any> {
  await waitFor(
    'the uploads under way at the fault to end',
    async () => {
      const now = new Map((await shardsOf(base, id)).map((x) => [x.index, x]));
      return [...before].every(([index, attempts]) => now.get(index).status === 'uploaded' || now.get(index).upload_attempts > attempts) || undefined;
    },
    30_000,
  );
  return (await call(base, `/v1/runs/${id}`)).body;
}

/** Failed uploads retried and failed again while the store stays away, and the run still answering. */
const RETRIES_WHILE_AWAY = 3;

/** Once the store is back at `t0`: /readyz 200, an upload beyond `uploaded`, the run's end; each with its time since `t0`. */
async function waitForRecovery(base: string, id: string, uploaded: number, t0: number, readyMs: number) {
  await waitForReadyz(base, 200, readyMs);
  const readyAfterMs = since(t0);
  await waitForRun(base, id, 'the shards that waited to be uploaded', (r) => r.shards.uploaded > uploaded, 30_000);
  const firstUploadAfterMs = since(t0);
  const done = await waitForEnd(base, id);
  return { done, readyAfterMs, firstUploadAfterMs, completedAfterMs: since(t0) };
}

describe('object store faults', () => {
  it('an S3 outage: shards wait through failed retries, upload once it is back, and the run completes with nothing lost', async () => {
    const BUCKET = 'regen-outage';
    const SAMPLES = 800;
    let s3 = await rig.startS3(BUCKET);
    const port = s3.port;
    const s = await sim('m-outage');
    const server = await rig.serve(rig.dir('regen-outage-'), { ...s3ServerEnv(s3.url, BUCKET), ...STORE_RETRY });
    const base = server.url;
    expect((await call(base, '/readyz')).status).toBe(200);
    const { prompts, fileId } = await preparePrompts(base, [s], SAMPLES, 'so');
    const { id } = await createRun(base, { model: 'm-outage', input: { file_id: fileId }, shard_size: SHARD_SIZE, regenerate: 'last_assistant' });
    const before = await waitForRun(base, id, 'a few shards uploaded', (r) => r.shards.uploaded >= 2);

    const underWay = await uploadable(base, id);
    await s3.stop();
    // And those that closed as it went.
    for (const [index, attempts] of await uploadable(base, id)) if (!underWay.has(index)) underWay.set(index, attempts);
    const tDown = performance.now();
    const down = await waitForReadyz(base, 503, 20_000);
    expect(down.body).toMatchObject({ status: 'unavailable', checks: { database: 'ok', object_store: 'unavailable' } });
    // Shards that close meanwhile fail to upload, say why on the shard, and are retried.
    const failing = await waitForFailedUploads(base, id, 25_000);
    expect(failing[0].last_error).toMatch(/^upload failed: .*connection refused.*; retrying/);
    const firstFailure = (await call(base, `/v1/runs/${id}`)).body;
    expect(doneOf(firstFailure), 'the run still has answers to give once the store is away').toBeLessThan(SAMPLES);
    // Counted once no upload begun before the store stopped can still land.
    const atFailure = await uploadedOnceSettled(base, id, underWay);
    await waitForFailedUploads(base, id, 30_000, RETRIES_WHILE_AWAY);
    const duringOutage = await waitForRun(base, id, 'answers while the store is away', (r) => doneOf(r) > doneOf(firstFailure));
    expect((await call(base, '/healthz')).status).toBe(200);
    expect(duringOutage.shards.uploaded).toBe(atFailure.shards.uploaded);
    expect(doneOf(duringOutage)).toBeGreaterThan(doneOf(firstFailure));
    const outageMs = since(tDown);

    s3 = await rig.startS3(BUCKET, port);
    const { done, readyAfterMs, firstUploadAfterMs, completedAfterMs } = await waitForRecovery(
      base,
      id,
      duringOutage.shards.uploaded,
      performance.now(),
      30_000,
    );
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    expect(done.shards).toEqual({ total: SAMPLES / SHARD_SIZE, uploaded: SAMPLES / SHARD_SIZE });
    const shards = await shardsOf(base, id);
    expect(shards.every((x) => x.last_error === null)).toBe(true);
    const retriedShards = shards.filter((x) => x.upload_attempts > 0).length;
    expect(retriedShards).toBeGreaterThan(0);

    const out = await readOutput(done, prompts, s3.url);
    expect(out.lines.size).toBe(SAMPLES);
    await expectCountersMatchRecount(base, done);
    // The process rode it out: one listening line, no crash.
    expect(server.proc.exitCode).toBeNull();
    console.log(
      'fault-storage s3:',
      JSON.stringify({
        samples: SAMPLES,
        outage_ms: outageMs,
        done_during_outage: doneOf(duringOutage) - doneOf(before),
        retried_shards: retriedShards,
        ready_after_ms: readyAfterMs,
        first_upload_after_ms: firstUploadAfterMs,
        completed_after_ms: completedAfterMs,
      }),
    );
  });

  it('a local output folder that cannot be written: a clear error on the shards, /readyz 503, no crash, recovery', async () => {
    const SAMPLES = 800;
    const data = rig.dir('regen-readonly-');
    const s = await sim('m-readonly');
    const server = await rig.serve(data, STORE_RETRY);
    const base = server.url;
    const { prompts, fileId } = await preparePrompts(base, [s], SAMPLES, 'ro');
    const { id } = await createRun(base, { model: 'm-readonly', input: { file_id: fileId }, shard_size: SHARD_SIZE, regenerate: 'last_assistant' });
    await waitForRun(base, id, 'a shard uploaded', (r) => r.shards.uploaded >= 1);

    const objects = join(data, 'objects');
    const underWay = await uploadable(base, id);
    await whileStopped(server.proc, () => {
      renameSync(objects, `${objects}.away`);
      writeFileSync(objects, 'not a folder');
    });
    for (const [index, attempts] of await uploadable(base, id)) if (!underWay.has(index)) underWay.set(index, attempts);
    const tBroken = performance.now();
    const down = await waitForReadyz(base, 503, 10_000);
    expect(down.body.checks.object_store).toBe('unavailable');
    const failing = await waitForFailedUploads(base, id, 30_000);
    // The folder is a file: writing its temp folder fails as not a folder or as missing, by platform and path.
    expect(failing[0].last_error).toMatch(/^upload failed: (not a directory \(ENOTDIR\)|no such file or folder \(ENOENT\)); retrying/);
    // No server path in what the API says.
    expect(JSON.stringify(failing)).not.toContain(data);
    // Counted once no upload begun before the folder went can still land.
    const atFailure = await uploadedOnceSettled(base, id, underWay);
    await waitForFailedUploads(base, id, 30_000, RETRIES_WHILE_AWAY);
    expect((await call(base, '/healthz')).status).toBe(200);
    const during = (await call(base, `/v1/runs/${id}`)).body;
    expect(during.shards.uploaded).toBe(atFailure.shards.uploaded);
    const brokenMs = since(tBroken);

    await whileStopped(server.proc, () => {
      rmSync(objects);
      renameSync(`${objects}.away`, objects);
    });
    const { done, firstUploadAfterMs, completedAfterMs } = await waitForRecovery(base, id, during.shards.uploaded, performance.now(), 10_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    const out = await readOutput(done, prompts);
    expect(out.lines.size).toBe(SAMPLES);
    await expectCountersMatchRecount(base, done);
    expect(server.proc.exitCode).toBeNull();
    // Each failure was logged as a warning with the shard, never as a crash.
    expect(server.output()).toMatch(/"msg":"shard upload failed"/);
    expect(server.output()).not.toMatch(/uncaught|unhandled/i);
    console.log(
      'fault-storage local:',
      JSON.stringify({
        samples: SAMPLES,
        broken_ms: brokenMs,
        failed_uploads: failing.length,
        first_upload_after_ms: firstUploadAfterMs,
        completed_after_ms: completedAfterMs,
        left_at_fix: SAMPLES - doneOf(during),
      }),
    );
  });
});
