// Expiry (README "Expiry"): uploads past their `expires_after`, batch outputs past their
// `output_expires_after` and run outputs past their `output.expires_after` lose their objects,
// local or S3, and keep their rows marked expired; a restart between creation and expiry still
// deletes them. REGEN_MIN_EXPIRY_SECONDS lowers OpenAI's one-hour minimum to seconds.
import { existsSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI, { BadRequestError, NotFoundError, toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { setEnv } from './support/env.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, tempDir, waitFor } from './support/server.js';
import { loadSource } from './support/build.js';
import type * as StorageModule from '../src/storage/index.js';

// s3rver ships no types; it is only started and stopped here.
const S3rver = createRequire(import.meta.url)('s3rver');
const { Stores } = await loadSource<typeof StorageModule>('src/storage/index.ts');

const MODEL = 'qwen3-sim';
const TOKEN = 'expiry-token';
const auth = { authorization: `Bearer ${TOKEN}` };
const SHORT = { REGEN_API_TOKENS: TOKEN, REGEN_MIN_EXPIRY_SECONDS: '1', REGEN_EXPIRY_INTERVAL_MS: '100', REGEN_SHARD_SIZE: '2' };
const lines = (n: number) =>
  Array.from({ length: n }, (_, i) => ({
    custom_id: `r-${i}`,
    method: 'POST',
    url: '/v1/chat/completions',
    body: { model: MODEL, messages: [{ role: 'user', content: `q ${i}` }] },
  }));
const jsonl = (ls: unknown[]) => ls.map((l) => JSON.stringify(l)).join('\n') + '\n';

let sim: SimProcess;

beforeAll(async () => {
  sim = await spawnSimulator({ model: MODEL, 'max-running': 8, 'context-length': 2000, 'ttft-ms': 5, 'tokens-per-second': 5000 });
});

afterAll(async () => {
  await sim?.stop();
});

async function serverWithEndpoint(env: Record<string, string> = {}, dataDir?: string) {
  const server = await startTestServer({ ...SHORT, ...env }, dataDir);
  const api = (path: string, init: RequestInit & { json?: unknown } = {}) => call(server.url, path, { ...init, headers: { ...auth, ...init.headers } });
  // An upsert by url: a restarted server finds its endpoint already registered.
  const ep = await api('/v1/endpoints', { method: 'POST', json: { url: sim.url } });
  expect(ep.status, JSON.stringify(ep.body)).toBeLessThan(300);
  // Not ready in time, the endpoints as the server last showed them are in the error.
  await waitFor('an endpoint ready', async () => {
    const { data } = (await api('/v1/endpoints')).body;
    if (data.some((e: any) => e.state === 'ready')) return true;
    throw new Error(JSON.stringify(data).slice(0, 2000));
  });
  return { server, api, client: new OpenAI({ baseURL: `${server.url}/v1`, apiKey: TOKEN, maxRetries: 0 }) };
}

async function finished(api: (p: string) => Promise<any>, id: string) {
  return waitFor(`run ${id} to finish`, async () => {
    const r = await api(`/v1/runs/${id}`);
    return ['completed', 'failed', 'cancelled'].includes(r.body.status) ? r.body : undefined;
  });
}

describe('an uploaded file with expires_after', () => {
  it('keeps its object, expired, and loses its content when the time passes; bounds refused naming the field', async () => {
    const { server, client } = await serverWithEndpoint();
    try {
      const file = await client.files.create({
        file: await toFile(Buffer.from(jsonl(lines(1))), 'short.jsonl'),
        purpose: 'batch',
        expires_after: { anchor: 'created_at', seconds: 1 },
      });
      expect(file.expires_at).toBe(file.created_at + 1);
      expect((file as any).expired).toBe(false);
      const kept = await client.files.create({ file: await toFile(Buffer.from(jsonl(lines(1))), 'kept.jsonl'), purpose: 'batch' });
      expect(kept.expires_at).toBeNull();
      const object = join(fileURLToPath(server.config.outputUri), 'files', `${file.id}.jsonl`);
      const expired = await waitFor('the file to expire', async () => {
        const f = await client.files.retrieve(file.id);
        return (f as any).expired ? f : undefined;
      });
      expect(expired).toMatchObject({ id: file.id, expires_at: file.expires_at, bytes: file.bytes });
      expect(existsSync(object)).toBe(false);
      const content = client.files.content(file.id);
      await expect(content).rejects.toBeInstanceOf(NotFoundError);
      await expect(content).rejects.toMatchObject({ message: expect.stringMatching(/expired at .*: its content was deleted/) });
      expect(await (await client.files.content(kept.id)).text()).toBe(jsonl(lines(1)));

      for (const [expires, param] of [
        [{ anchor: 'created_at', seconds: 2_592_001 }, 'expires_after.seconds'],
        [{ anchor: 'last_active_at', seconds: 10 }, 'expires_after.anchor'],
      ] as const) {
        const refused = client.files.create({ file: await toFile(Buffer.from(jsonl(lines(1))), 'x.jsonl'), purpose: 'batch', expires_after: expires as never });
        await expect(refused).rejects.toBeInstanceOf(BadRequestError);
        await expect(refused).rejects.toMatchObject({ param });
      }
    } finally {
      await server.cleanup();
    }
  });
});

describe("a batch's output_expires_after", () => {
  it('deletes its output and error files with the shards behind them, the batch and its run kept', async () => {
    const { server, client, api } = await serverWithEndpoint();
    try {
      const input = await client.files.create({ file: await toFile(Buffer.from(jsonl([...lines(3), 'not json'])), 'b.jsonl'), purpose: 'batch' });
      const created = await client.batches.create({
        input_file_id: input.id,
        endpoint: '/v1/chat/completions',
        completion_window: '24h',
        output_expires_after: { anchor: 'created_at', seconds: 5 },
      });
      const done = await waitFor('the batch to complete', async () => {
        const b = await client.batches.retrieve(created.id);
        return b.status === 'completed' ? b : undefined;
      });
      const run = (await api('/v1/runs?limit=1000')).body.data.find((r: any) => r.name === done.id);
      const prefix = fileURLToPath(run.output_uri);
      expect(existsSync(join(prefix, 'shard-00000.jsonl'))).toBe(true);
      const output = await client.files.retrieve(done.output_file_id!);
      expect(output.expires_at).toBe(Math.floor(Date.parse(run.finished_at) / 1000) + 5);
      expect((await (await client.files.content(done.output_file_id!)).text()).split('\n').filter(Boolean)).toHaveLength(3);

      await waitFor('the output to expire', async () => ((await client.files.retrieve(done.output_file_id!)) as any).expired || undefined);
      for (const key of ['shard-00000.jsonl', 'shard-00001.jsonl', 'manifest.json']) expect(existsSync(join(prefix, key)), key).toBe(false);
      await expect(client.files.content(done.output_file_id!)).rejects.toBeInstanceOf(NotFoundError);
      await expect(client.files.content(done.error_file_id!)).rejects.toBeInstanceOf(NotFoundError);
      expect(await client.batches.retrieve(done.id)).toMatchObject({ status: 'completed', request_counts: { total: 4, completed: 3, failed: 1 } });
      const after = (await api(`/v1/runs/${run.id}`)).body;
      expect(after).toMatchObject({ status: 'completed', output_expired: true, request_counts: { completed: 3 } });
      // The input file had no expiry of its own.
      expect((await client.files.retrieve(input.id)).expires_at).toBeNull();

      const refused = client.batches.create({
        input_file_id: input.id,
        endpoint: '/v1/chat/completions',
        completion_window: '24h',
        output_expires_after: { anchor: 'created_at', seconds: 0 },
      });
      await expect(refused).rejects.toMatchObject({ status: 400, param: 'output_expires_after.seconds' });
    } finally {
      await server.cleanup();
    }
  });
});

describe("a run's output.expires_after", () => {
  it('survives a restart between the finish and the expiry: the restarted server deletes the output', async () => {
    const data = tempDir('regen-expiry-');
    try {
      let { server, api } = await serverWithEndpoint({}, data.dir);
      const created = await api('/v1/runs', {
        method: 'POST',
        json: {
          model: MODEL,
          params: { max_tokens: 8 },
          output: { expires_after: { seconds: 6 } },
          input: { requests: [{ prompt: 'a' }, { prompt: 'b' }, { prompt: 'c' }] },
        },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      const run = await finished(api, created.body.id);
      expect(run.output_expires_at).toBe(new Date(Date.parse(run.finished_at) + 6000).toISOString());
      expect(run.output_expired).toBe(false);
      await server.cleanup();
      const prefix = fileURLToPath(run.output_uri);
      // Down before the expiry came: the output is all there.
      for (const key of ['shard-00000.jsonl', 'shard-00001.jsonl', 'manifest.json']) expect(existsSync(join(prefix, key)), key).toBe(true);
      await waitFor('the expiry to pass while the server is down', async () => (Date.now() > Date.parse(run.output_expires_at) ? true : undefined));

      ({ server, api } = await serverWithEndpoint({}, data.dir));
      try {
        const expired = await waitFor('the output to expire', async () => {
          const r = (await api(`/v1/runs/${run.id}`)).body;
          return r.output_expired ? r : undefined;
        });
        expect(expired).toMatchObject({ status: 'completed', request_counts: { total: 3, completed: 3 } });
        for (const key of ['shard-00000.jsonl', 'shard-00001.jsonl', 'manifest.json']) expect(existsSync(join(prefix, key)), key).toBe(false);
        // The samples stay without their answers; a retry would write a manifest of deleted shards.
        const sample = await api(`/v1/runs/${run.id}/samples/line-1`);
        expect(sample.status, JSON.stringify(sample.body)).toBe(200);
        expect(sample.body).toMatchObject({ status: 'completed', output: null });
        const retry = await api(`/v1/runs/${run.id}/retry`, { method: 'POST', json: {} });
        expect(retry.status).toBe(409);
        expect(retry.body.detail).toMatch(/output expired/);
      } finally {
        await server.cleanup();
      }
    } finally {
      data.cleanup();
    }
  });

  it("deletes a conversation run's token rows and card and drops its turns, beside a run kept 30 days (64-bit sums on PostgreSQL)", async () => {
    const { server, api } = await serverWithEndpoint();
    try {
      const conversation = (i: number) => ({
        custom_id: `c-${i}`,
        messages: [
          { role: 'user', content: `first ${i}` },
          { role: 'assistant', content: 'old' },
          { role: 'user', content: `second ${i}` },
          { role: 'assistant', content: 'old' },
        ],
      });
      // Finished first, with the longest lifetime allowed: its sum overflowed PostgreSQL's 32-bit
      // integers and failed every sweep, so no other run's output went either.
      const kept = await api('/v1/runs', {
        method: 'POST',
        json: { model: MODEL, params: { max_tokens: 8 }, output: { expires_after: { seconds: 30 * 86_400 } }, input: { requests: [{ prompt: 'a' }] } },
      });
      expect(kept.status, JSON.stringify(kept.body)).toBe(201);
      await finished(api, kept.body.id);
      const created = await api('/v1/runs', {
        method: 'POST',
        json: {
          model: MODEL,
          regenerate: 'all_assistant',
          params: { max_tokens: 8 },
          quality: { enabled: false },
          output: { tokens: true, expires_after: { seconds: 4 } },
          input: { requests: [conversation(0), conversation(1)] },
        },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      const run = await finished(api, created.body.id);
      expect(run.status).toBe('completed');
      const prefix = fileURLToPath(run.output_uri);
      const written = ['shard-00000.jsonl', 'tokens/shard-00000.jsonl', 'README.md', 'manifest.json'];
      for (const key of written) expect(existsSync(join(prefix, key)), key).toBe(true);
      expect((await api(`/v1/runs/${run.id}/samples/c-0`)).body.turns).toHaveLength(2);

      const expired = await waitFor('the output to expire', async () => {
        const r = (await api(`/v1/runs/${run.id}`)).body;
        return r.output_expired ? r : undefined;
      });
      expect(expired.status).toBe('completed');
      for (const key of written) expect(existsSync(join(prefix, key)), key).toBe(false);
      const sample = (await api(`/v1/runs/${run.id}/samples/c-0`)).body;
      expect(sample).toMatchObject({ status: 'completed', output: null });
      expect(sample.turns ?? []).toEqual([]);
      expect((await api(`/v1/runs/${kept.body.id}`)).body.output_expired).toBe(false);
    } finally {
      await server.cleanup();
    }
  });

  it('deletes the objects from S3 too', async () => {
    const bucketName = 'regen-expiry';
    const s3dir = tempDir('regen-s3rver-');
    const s3 = new S3rver({ address: '127.0.0.1', port: 0, silent: true, directory: s3dir.dir, configureBuckets: [{ name: bucketName, configs: [] }] });
    const endpoint = `http://127.0.0.1:${((await s3.run()) as AddressInfo).port}`;
    const restoreEnv = setEnv({ AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER', AWS_REGION: 'us-east-1' });
    const stores = new Stores({ endpoint, forcePathStyle: true });
    const { server, api } = await serverWithEndpoint({ REGEN_S3_ENDPOINT: endpoint, REGEN_S3_FORCE_PATH_STYLE: 'true' });
    try {
      const created = await api('/v1/runs', {
        method: 'POST',
        json: {
          model: MODEL,
          params: { max_tokens: 8 },
          output: { uri: `s3://${bucketName}/runs/expiring/`, format: 'parquet', expires_after: { seconds: 5 } },
          input: { requests: [{ prompt: 'a' }, { prompt: 'b' }, { prompt: 'c' }] },
        },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      const run = await finished(api, created.body.id);
      expect(run.status).toBe('completed');
      const bucket = stores.forUri(`s3://${bucketName}/runs/expiring/`);
      const keys = ['shard-00000.parquet', 'shard-00001.parquet', 'manifest.json', 'README.md'];
      for (const key of keys) expect(await bucket.head(key), key).not.toBeNull();
      await waitFor('the output to expire', async () => ((await api(`/v1/runs/${run.id}`)).body.output_expired ? true : undefined));
      for (const key of keys) expect(await bucket.head(key), key).toBeNull();
    } finally {
      await server.cleanup();
      stores.close();
      restoreEnv();
      await s3.close();
      s3dir.cleanup();
    }
  });
});
