import { existsSync, mkdirSync, readdirSync, rmSync, utimesSync, watch, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import { TEMP_FOLDER } from '../src/storage/location.js';
import { faultRig, readOutput, waitForEnd, waitForRun } from './support/fault-rig.js';
import { call, waitFor, type ServerProcess } from './support/server.js';
import { createRun, registerEndpoint, uploadFile, type Prompts } from './support/runner-checks.js';

// The output location fails, or regen dies while writing to it: nothing partial where readers
// look, a run that cannot be written says why and ends, and cancel always wins.

const rig = faultRig();
/**
 * Short store retries: the ten attempts before a run fails take about 3 s (20 ms doubling to its
 * cap of 600 ms, each attempt on a runner tick), not minutes.
 */
const FAST_RETRY = { REGEN_STORE_RETRY_MS: '20' };
const FINAL = /^(shard-\d{5}(\.errors)?\.jsonl|manifest\.json)$/;

/**
 * One server for each environment, shared by the tests that neither kill it nor break its store:
 * each has its own model, endpoint, run and output prefix. A server's start is seconds of CPU on
 * a loaded machine.
 * Those tests run one after another (no `concurrent` here): a shared server's logs and counters
 * then belong to one test at a time.
 */
const shared = new Map<string, Promise<{ server: ServerProcess; data: string }>>();
function sharedServer(env: Record<string, string> = {}): Promise<{ server: ServerProcess; data: string }> {
  const key = JSON.stringify(env);
  let started = shared.get(key);
  if (!started) {
    const data = rig.dir('regen-shared-');
    started = rig.serve(data, env).then((server) => ({ server, data }));
    shared.set(key, started);
    // A start that failed fails its own test only: the next one starts the server again.
    started.catch(() => shared.delete(key));
  }
  return started;
}

const sim = (model: string, extra: Record<string, number> = {}) => rig.sim({ model, 'max-running': 64, 'ttft-ms': 5, 'tokens-per-second': 100_000, ...extra });

/** `n` prompts with a long system turn each, so that one shard is tens of megabytes. */
function bigPrompts(n: number, padBytes: number): Prompts {
  const expected = new Map<string, any[]>();
  const lines: string[] = [];
  for (let i = 0; i < n; i++) {
    const messages = [
      { role: 'system', content: `${i} ${'x'.repeat(padBytes)}` },
      { role: 'user', content: `Question ${i}` },
    ];
    expected.set(`big-${i}`, messages);
    lines.push(JSON.stringify({ custom_id: `big-${i}`, messages }));
  }
  return { jsonl: lines.join('\n') + '\n', expected };
}

/** A file put in a prefix's place blocks every write to it. */
function blockPrefix(prefix: string): void {
  mkdirSync(join(prefix, '..'), { recursive: true });
  rmSync(prefix, { recursive: true, force: true });
  writeFileSync(prefix.replace(/\/$/, ''), 'in the way');
}

const filesIn = (dir: string): string[] => (existsSync(dir) ? readdirSync(dir) : []);

describe('writing the output', () => {
  it('kill -9 in the middle of a shard write leaves only whole objects in the prefix, and a restart completes the run', async () => {
    const SAMPLES = 1200;
    const data = rig.dir('regen-killwrite-');
    const s = await sim('m-kill');
    let server = await rig.serve(data);
    await registerEndpoint(server.url, s.url);
    const prompts = bigPrompts(SAMPLES, 25_000);
    const fileId = await uploadFile(server.url, prompts.jsonl);
    // One shard of ~30 MB: its write takes long enough for the kill to land inside it.
    const run = await createRun(server.url, { model: 'm-kill', input: { file_id: fileId }, shard_size: SAMPLES });
    const prefix = fileURLToPath(run.output_uri);
    const temp = join(prefix, TEMP_FOLDER);
    mkdirSync(prefix, { recursive: true });
    mkdirSync(temp, { recursive: true });
    // The first object that is not a final one (a temp file, wherever it is written) is the moment to kill.
    const killed = new Promise<string>((resolve) => {
      const watchers = [prefix, temp].map((dir) =>
        watch(dir, (_event, name) => {
          if (!name || FINAL.test(String(name)) || name === TEMP_FOLDER || String(name).startsWith('.regen-probe')) return;
          server.proc.kill('SIGKILL');
          for (const w of watchers) w.close();
          resolve(String(name));
        }),
      );
    });
    const caught = await killed;
    await waitFor('the server to die', () => (server.proc.exitCode !== null || server.proc.signalCode !== null ? true : undefined));
    expect(filesIn(prefix).filter((f) => !FINAL.test(f) && f !== TEMP_FOLDER)).toEqual([]);
    // The kill landed inside the write: its temp file is still there, in the prefix's temp folder.
    expect(filesIn(temp)).toContain(caught);

    // A leftover older than a write could be is swept at the next start.
    const old = new Date(Date.now() - 2 * 3600_000);
    for (const f of filesIn(temp)) utimesSync(join(temp, f), old, old);
    server = await rig.serve(data);
    const done = await waitForEnd(server.url, run.id);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES });
    // The run's temp folder goes once it ended: the folder holds what the manifest lists.
    await waitFor('the temp folder to go', () => (existsSync(temp) ? undefined : true));
    expect(filesIn(prefix).sort()).toEqual(['manifest.json', 'shard-00000.jsonl']);
    const out = await readOutput(done, prompts);
    expect(out.lines.size).toBe(SAMPLES);
  });

  it('a file in the way of output.uri is refused at creation, naming output.uri', async () => {
    const { server, data } = await sharedServer();
    writeFileSync(join(data, 'blocked'), 'a file, not a folder');
    const res = await call(server.url, '/v1/runs', {
      method: 'POST',
      json: { model: 'm', input: { requests: [{ prompt: 'x' }] }, output: { uri: `${pathToFileURL(data).href}/blocked/` } },
    });
    expect(res.status).toBe(422);
    expect(res.body).toMatchObject({ code: 'validation_failed', field: 'output.uri' });
    expect(res.body.detail).toMatch(/cannot be written/);
    expect(JSON.stringify(res.body)).not.toContain(data);
  });

  it('an s3:// output without credentials is refused at creation, naming output.uri', async () => {
    const BUCKET = 'regen-nocreds';
    const s3 = await rig.startS3(BUCKET);
    const data = rig.dir('regen-nocreds-');
    const server = await rig.serve(data, {
      REGEN_S3_ENDPOINT: s3.url,
      REGEN_S3_FORCE_PATH_STYLE: 'true',
      AWS_ACCESS_KEY_ID: '',
      AWS_SECRET_ACCESS_KEY: '',
      AWS_EC2_METADATA_DISABLED: 'true',
      AWS_SHARED_CREDENTIALS_FILE: join(data, 'none'),
      AWS_CONFIG_FILE: join(data, 'none'),
    });
    const res = await call(server.url, '/v1/runs', {
      method: 'POST',
      json: { model: 'm', input: { requests: [{ prompt: 'x' }] }, output: { uri: `s3://${BUCKET}/out/` } },
    });
    expect(res.status).toBe(422);
    expect(res.body).toMatchObject({ code: 'validation_failed', field: 'output.uri' });
  });

  it('shards that cannot be written: the run says why after 3 attempts, fails after 10, and a retry writes them once the store is fixed', async () => {
    const SAMPLES = 60;
    const s = await sim('m-blocked');
    const { server } = await sharedServer(FAST_RETRY);
    const base = server.url;
    await registerEndpoint(base, s.url);
    const prompts = bigPrompts(SAMPLES, 10);
    const fileId = await uploadFile(base, prompts.jsonl);
    const run = await createRun(base, { model: 'm-blocked', input: { file_id: fileId }, shard_size: 20 });
    const prefix = fileURLToPath(run.output_uri);
    blockPrefix(prefix);
    const reasoned = await waitForRun(base, run.id, 'a status reason from the failing uploads', (r) => /shard uploads failing/.test(r.status_reason ?? ''));
    expect(['in_progress', 'finalizing', 'queued']).toContain(reasoned.status);
    const failed = await waitForEnd(base, run.id);
    expect(failed.status).toBe('failed');
    expect(failed.status_reason).toMatch(/could not be written after 10 attempts: .*(not a directory|a file is in the way)/);
    expect(failed.request_counts).toMatchObject({ completed: SAMPLES });

    rmSync(prefix.replace(/\/$/, ''));
    const retried = await call(base, `/v1/runs/${run.id}/retry`, { method: 'POST', json: { only: 'failed' } });
    expect(retried.status, JSON.stringify(retried.body)).toBe(200);
    const done = await waitForEnd(base, run.id);
    expect(done.status, done.status_reason ?? '').toBe('completed');
    expect(done.status_reason).toBeNull();
    expect(done.shards).toEqual({ total: 3, uploaded: 3 });
    expect((await readOutput(done, prompts)).lines.size).toBe(SAMPLES);
  });

  it('a run failed by its uploads while answers are in flight keeps those samples, and a retry writes them', async () => {
    const SAMPLES = 80;
    // Slow answers, four at a time (12 s for all of them): the escalation (about 3 s of retries) lands while requests are out.
    const s = await sim('m-inflight', { 'max-running': 4, 'ttft-ms': 600 });
    const { server } = await sharedServer(FAST_RETRY);
    const base = server.url;
    await registerEndpoint(base, s.url, { max_concurrency: 4 });
    const prompts = bigPrompts(SAMPLES, 10);
    const fileId = await uploadFile(base, prompts.jsonl);
    const run = await createRun(base, { model: 'm-inflight', input: { file_id: fileId }, shard_size: 4, calibration: { samples: 0 } });
    const prefix = fileURLToPath(run.output_uri);
    blockPrefix(prefix);
    const failed = await waitForEnd(base, run.id);
    expect(failed.status).toBe('failed');
    expect(failed.request_counts.completed).toBeLessThan(SAMPLES);
    // The requests out when the run failed come back to the queue, none of them ended as cancelled.
    const settled = await waitForRun(base, run.id, 'no request in flight', (r) => r.request_counts.in_progress === 0);
    const counts = settled.request_counts;
    expect(counts.cancelled).toBe(0);
    expect(counts.completed + counts.failed + counts.pending).toBe(SAMPLES);

    // The retry's answers need not be slow: what it proves is that the samples kept are written.
    await s.configure({ ttftMs: 5 });
    rmSync(prefix.replace(/\/$/, ''));
    const retried = await call(base, `/v1/runs/${run.id}/retry`, { method: 'POST', json: { only: 'failed' } });
    expect(retried.status, JSON.stringify(retried.body)).toBe(200);
    const done = await waitForEnd(base, run.id, 120_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, cancelled: 0 });
    expect((await readOutput(done, prompts)).lines.size).toBe(SAMPLES);
  });

  it('cancel ends a run whose shards cannot be written, across a restart too', async () => {
    const SAMPLES = 40;
    const data = rig.dir('regen-cancelblocked-');
    const s = await sim('m-cb');
    // Retries a minute apart: without cancel winning, the run would sit in cancelling.
    let server = await rig.serve(data, { REGEN_STORE_RETRY_MS: '60000' });
    await registerEndpoint(server.url, s.url);
    const prompts = bigPrompts(SAMPLES, 10);
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const run = await createRun(server.url, { model: 'm-cb', input: { file_id: fileId }, shard_size: 10 });
    const prefix = fileURLToPath(run.output_uri);
    blockPrefix(prefix);
    await waitFor('a failed upload', async () => {
      const shards = (await call(server.url, `/v1/runs/${run.id}/shards`)).body.data;
      return shards.some((x: any) => x.upload_attempts > 0) ? true : undefined;
    });
    // Killed and started again: the failed attempts are on the shards, so cancel still ends it.
    await server.kill('SIGKILL');
    server = await rig.serve(data, { REGEN_STORE_RETRY_MS: '60000' });
    const cancel = await call(server.url, `/v1/runs/${run.id}/cancel`, { method: 'POST' });
    expect(cancel.status, JSON.stringify(cancel.body)).toBe(200);
    const done = await waitForEnd(server.url, run.id, 60_000);
    expect(done.status).toBe('cancelled');
    expect(done.status_reason).toMatch(/shards not written: upload failed: .*(not a directory|a file is in the way)/);
  });

  it('a run cancelled after all its answers, its shards unwritten, is written by a retry once the store is fixed', async () => {
    const SAMPLES = 20;
    const data = rig.dir('regen-cancelretry-');
    const s = await sim('m-cr');
    // Retries a minute apart: each shard is tried once before the cancel.
    const server = await rig.serve(data, { REGEN_STORE_RETRY_MS: '60000' });
    await registerEndpoint(server.url, s.url);
    const prompts = bigPrompts(SAMPLES, 10);
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const run = await createRun(server.url, { model: 'm-cr', input: { file_id: fileId }, shard_size: 10, calibration: { samples: 0 } });
    const prefix = fileURLToPath(run.output_uri);
    blockPrefix(prefix);
    await waitForRun(server.url, run.id, 'every answer in', (r) => r.request_counts.completed === SAMPLES);
    await waitFor('every shard tried', async () => {
      const shards = (await call(server.url, `/v1/runs/${run.id}/shards`)).body.data;
      return shards.every((x: any) => x.upload_attempts > 0) ? true : undefined;
    });
    expect((await call(server.url, `/v1/runs/${run.id}/cancel`, { method: 'POST' })).status).toBe(200);
    expect((await waitForEnd(server.url, run.id)).status).toBe('cancelled');
    rmSync(prefix.replace(/\/$/, ''));
    const retried = await call(server.url, `/v1/runs/${run.id}/retry`, { method: 'POST', json: { only: 'failed' } });
    expect(retried.status, JSON.stringify(retried.body)).toBe(200);
    // Well within the minute of backoff the failed attempts left: the retry's fresh budget does not wait it out.
    const done = await waitForEnd(server.url, run.id, 30_000);
    expect(done.status, done.status_reason ?? '').toBe('completed');
    expect(done.shards).toEqual({ total: 2, uploaded: 2 });
    expect((await readOutput(done, prompts)).lines.size).toBe(SAMPLES);
  });

  it('a run cancelled early writes no empty shard files; the manifest lists the empty shards', async () => {
    const SAMPLES = 400;
    // Slow answers, a few at a time: most shards are still untouched when the cancel lands.
    const s = await sim('m-empty', { 'max-running': 4, 'ttft-ms': 300 });
    const { server } = await sharedServer();
    await registerEndpoint(server.url, s.url, { max_concurrency: 4 });
    const prompts = bigPrompts(SAMPLES, 10);
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const run = await createRun(server.url, { model: 'm-empty', input: { file_id: fileId }, shard_size: 10, calibration: { samples: 0 } });
    await waitForRun(server.url, run.id, 'a few answers', (r) => r.request_counts.completed >= 4);
    expect((await call(server.url, `/v1/runs/${run.id}/cancel`, { method: 'POST' })).status).toBe(200);
    const done = await waitForEnd(server.url, run.id);
    expect(done.status).toBe('cancelled');
    const out = await readOutput(done, prompts);
    const manifest = out.manifest;
    expect(manifest.shards).toHaveLength(SAMPLES / 10);
    const written = manifest.shards.filter((x: any) => !x.empty);
    const empty = manifest.shards.filter((x: any) => x.empty);
    expect(empty.length).toBeGreaterThan(SAMPLES / 10 / 2);
    for (const x of empty) expect(x).toMatchObject({ key: null, lines: 0 });
    const files = filesIn(fileURLToPath(done.output_uri)).filter((f) => /^shard-\d{5}\.jsonl$/.test(f));
    expect(files.sort()).toEqual(written.map((x: any) => x.key).sort());
    expect(written.reduce((n: number, x: any) => n + x.lines, 0)).toBe(done.request_counts.completed);
  });
});
