// Completions and embeddings through OpenAI's Batch API (the official `openai` SDK, every line held
// to OpenAI's schemas) and through regen's own runs (`endpoint`), against the simulator's
// /v1/completions and /v1/embeddings.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DuckDBInstance } from '@duckdb/node-api';
import OpenAI, { BadRequestError, toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openaiViolations } from './support/openai-schemas.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, waitFor } from './support/server.js';

const MODEL = 'qwen3-sim';
const TOKEN = 'batch-endpoints-token';
const auth = { authorization: `Bearer ${TOKEN}` };
const TERMINAL = ['completed', 'failed', 'cancelled', 'expired'];
// The simulator's embedding size when a request asks no `dimensions` (src/sim/raw.ts).
const SIM_DIMENSIONS = 32;

let server: Awaited<ReturnType<typeof startTestServer>>;
let sim: SimProcess;
let client: OpenAI;

const api = (path: string, init: RequestInit & { json?: unknown } = {}) => call(server.url, path, { ...init, headers: { ...auth, ...init.headers } });
const jsonl = (lines: unknown[]) => lines.map((l) => JSON.stringify(l)).join('\n') + '\n';

function expectConforms(schema: string, body: unknown) {
  expect(openaiViolations(schema, body), JSON.stringify(body).slice(0, 500)).toEqual([]);
}

async function submit(endpoint: '/v1/completions' | '/v1/embeddings', lines: unknown[]) {
  const file = await client.files.create({ file: await toFile(Buffer.from(jsonl(lines)), 'in.jsonl'), purpose: 'batch' });
  return client.batches.create({ input_file_id: file.id, endpoint, completion_window: '24h' });
}

async function settle(id: string) {
  return waitFor(`batch ${id} to finish`, async () => {
    const b = await client.batches.retrieve(id);
    return TERMINAL.includes(b.status) ? b : undefined;
  });
}

async function content(fileId: string): Promise<any[]> {
  const text = await (await client.files.content(fileId)).text();
  return text
    .trimEnd()
    .split('\n')
    .map((l) => JSON.parse(l));
}

const line = (custom_id: string, url: string, body: Record<string, unknown>) => ({ custom_id, method: 'POST', url, body: { model: MODEL, ...body } });

beforeAll(async () => {
  sim = await spawnSimulator({ model: MODEL, 'max-running': 8, 'context-length': 2000, 'ttft-ms': 5, 'tokens-per-second': 5000 });
  server = await startTestServer({ REGEN_API_TOKENS: TOKEN, REGEN_SHARD_SIZE: '4' });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: TOKEN, maxRetries: 0 });
  const ep = await api('/v1/endpoints', { method: 'POST', json: { url: sim.url } });
  expect(ep.status, JSON.stringify(ep.body)).toBeLessThan(300);
  await waitFor('the endpoint to be ready', async () => ((await api(`/v1/endpoints/${ep.body.id}`)).body.state === 'ready' ? true : undefined));
});

afterAll(async () => {
  await server?.cleanup();
  await sim?.stop();
});

describe('a completions batch', () => {
  it("answers text and token-id prompts as OpenAI's text_completion, and lists a line for another endpoint as an error", async () => {
    const lines = [
      line('text', '/v1/completions', { prompt: 'The capital of France is', max_tokens: 16 }),
      line('tokens', '/v1/completions', { prompt: [151644, 872, 198], max_tokens: 16 }),
      line('echo', '/v1/completions', { prompt: 'Echo me:', echo: true, max_tokens: 8 }),
      line('two', '/v1/completions', { prompt: 'Two answers', n: 2, max_tokens: 8 }),
      line('chat', '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }),
    ];
    const created = await submit('/v1/completions', lines);
    expect(created.endpoint).toBe('/v1/completions');
    const done = await settle(created.id);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toEqual({ total: 5, completed: 4, failed: 1 });

    const out = await content(done.output_file_id!);
    expect(out.map((l) => l.custom_id).sort()).toEqual(['echo', 'text', 'tokens', 'two']);
    for (const l of out) {
      expectConforms('BatchRequestOutput', l);
      expectConforms('CreateCompletionResponse', l.response.body);
      expect(l.response.body).toMatchObject({ object: 'text_completion', model: MODEL });
      expect(l.response.body.choices[0].text.length).toBeGreaterThan(0);
    }
    const byId = new Map(out.map((l) => [l.custom_id, l.response.body]));
    expect(byId.get('echo').choices[0].text.startsWith('Echo me:')).toBe(true);
    expect(byId.get('two').choices.map((c: any) => c.index)).toEqual([0, 1]);
    expect(byId.get('tokens').usage.prompt_tokens).toBeGreaterThan(0);

    // The batch's usage covers its completions: the run's tokens, at least what the lines report.
    const sum = (f: (u: any) => number) => out.reduce((n, l) => n + f(l.response.body.usage), 0);
    expect(done.usage?.input_tokens).toBeGreaterThanOrEqual(sum((u) => u.prompt_tokens));
    expect(done.usage?.output_tokens).toBeGreaterThanOrEqual(sum((u) => u.completion_tokens));
    expect(sum((u) => u.completion_tokens)).toBeGreaterThan(0);

    const errors = await content(done.error_file_id!);
    expect(errors).toHaveLength(1);
    expectConforms('BatchRequestOutput', errors[0]);
    expect(errors[0]).toMatchObject({ custom_id: 'chat', error: { code: 'mismatched_endpoint' } });
    expect(errors[0].error.message).toMatch(/url "\/v1\/chat\/completions" differs from the batch's endpoint "\/v1\/completions"/);
    expect(done.errors?.data?.[0]).toMatchObject({ code: 'mismatched_endpoint', line: 5, param: 'url' });
  });
});

describe('an embeddings batch', () => {
  it("answers OpenAI's embeddings list, the same input the same vector, base64 when asked", async () => {
    const lines = [
      line('a', '/v1/embeddings', { input: 'a sentence to embed' }),
      line('a-again', '/v1/embeddings', { input: 'a sentence to embed' }),
      line('ids', '/v1/embeddings', { input: [101, 2023, 102] }),
      line('small', '/v1/embeddings', { input: 'a sentence to embed', dimensions: 8 }),
      line('b64', '/v1/embeddings', { input: 'a sentence to embed', encoding_format: 'base64' }),
      line('several', '/v1/embeddings', { input: ['one', 'two'] }),
    ];
    const done = await settle((await submit('/v1/embeddings', lines)).id);
    expect(done.status).toBe('completed');
    expect(done.endpoint).toBe('/v1/embeddings');
    expect(done.request_counts).toEqual({ total: 6, completed: 5, failed: 1 });
    const out = new Map((await content(done.output_file_id!)).map((l) => [l.custom_id, l]));
    for (const l of out.values()) {
      expectConforms('BatchRequestOutput', l);
      if (l.custom_id !== 'b64') expectConforms('CreateEmbeddingResponse', l.response.body);
      expect(l.response.body.usage.total_tokens).toBe(l.response.body.usage.prompt_tokens);
    }
    const vector = (id: string) => out.get(id).response.body.data[0].embedding;
    expect(vector('a')).toHaveLength(SIM_DIMENSIONS);
    expect(vector('a-again')).toEqual(vector('a'));
    expect(vector('ids')).not.toEqual(vector('a'));
    expect(vector('small')).toHaveLength(8);
    // OpenAI's base64: the float32s of the vector, little-endian.
    const bytes = Buffer.from(vector('b64'), 'base64');
    const decoded = Array.from({ length: bytes.length / 4 }, (_, i) => bytes.readFloatLE(i * 4));
    expect(decoded).toEqual(vector('a').map((v: number) => Math.fround(v)));
    expect(done.usage?.input_tokens).toBeGreaterThan(0);
    expect(done.usage?.output_tokens).toBe(0);

    const errors = await content(done.error_file_id!);
    expect(errors).toMatchObject([{ custom_id: 'several', error: { code: 'invalid_request' } }]);
    expect(errors[0].error.message).toMatch(/body\.input: one input a line/);
  });

  it("refuses /v1/responses and other endpoints in OpenAI's envelope, naming what is supported", async () => {
    const file = await client.files.create({
      file: await toFile(Buffer.from(jsonl([line('r', '/v1/responses', { input: 'hi' })])), 'r.jsonl'),
      purpose: 'batch',
    });
    const refused = client.batches.create({ input_file_id: file.id, endpoint: '/v1/responses', completion_window: '24h' });
    await expect(refused).rejects.toBeInstanceOf(BadRequestError);
    await expect(refused).rejects.toMatchObject({
      param: 'endpoint',
      message: expect.stringMatching(/"\/v1\/responses" is not supported: regen runs "\/v1\/chat\/completions", "\/v1\/completions", "\/v1\/embeddings"/),
    });
  });
});

describe("regen's own runs with an endpoint", () => {
  async function finished(id: string) {
    return waitFor(`run ${id} to finish`, async () => {
      const r = await api(`/v1/runs/${id}`);
      return ['completed', 'failed', 'cancelled'].includes(r.body.status) ? r.body : undefined;
    });
  }
  const shardLines = (run: any) =>
    readFileSync(join(fileURLToPath(run.output_uri), 'shard-00000.jsonl'), 'utf8')
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l));

  it("writes a raw prompt's `text` and an input's `embedding`, floats or base64", async () => {
    const completions = await api('/v1/runs', {
      method: 'POST',
      json: {
        model: MODEL,
        endpoint: '/v1/completions',
        params: { max_tokens: 8 },
        input: {
          requests: [
            { id: 'p1', prompt: 'Once upon a time' },
            { id: 'p2', prompt: [1, 2, 3], source: 'ids' },
          ],
        },
      },
    });
    expect(completions.status, JSON.stringify(completions.body)).toBe(201);
    expect(completions.body.endpoint).toBe('/v1/completions');
    const embeddings = await api('/v1/runs', {
      method: 'POST',
      json: {
        model: MODEL,
        endpoint: '/v1/embeddings',
        params: { encoding_format: 'base64', dimensions: 4 },
        input: { requests: [{ id: 'e1', input: 'embed me' }] },
      },
    });
    expect(embeddings.status, JSON.stringify(embeddings.body)).toBe(201);

    const c = await finished(completions.body.id);
    expect(c.status).toBe('completed');
    const cl = shardLines(c);
    expect(cl.map((l) => l.custom_id)).toEqual(['p1', 'p2']);
    expect(cl[0]).toMatchObject({ prompt: 'Once upon a time', text: expect.any(String), finish_reason: expect.any(String), model: MODEL });
    expect(cl[0]).not.toHaveProperty('messages');
    expect(cl[1]).toMatchObject({ prompt: [1, 2, 3], metadata: { source: 'ids' } });

    const e = await finished(embeddings.body.id);
    expect(e.status).toBe('completed');
    const [el] = shardLines(e);
    expect(el).toMatchObject({ custom_id: 'e1', input: 'embed me', embedding: expect.any(String) });
    expect(Buffer.from(el.embedding, 'base64')).toHaveLength(4 * 4);
    expect(el.usage.prompt_tokens).toBeGreaterThan(0);
  });

  it('writes Parquet with a split: the text, and the embedding as list<float32>, read back by DuckDB, with its features on the card', async () => {
    const inputs = Array.from({ length: 24 }, (_, i) => ({ id: `e${i}`, input: `embed number ${i}` }));
    const create = async (json: Record<string, unknown>) => {
      const res = await api('/v1/runs', { method: 'POST', json: { model: MODEL, output: { format: 'parquet' }, split: { eval: 0.3 }, ...json } });
      expect(res.status, JSON.stringify(res.body)).toBe(201);
      return finished(res.body.id);
    };
    // The line asks base64: Parquet holds floats whatever the encoding a JSON line would take.
    const e = await create({ endpoint: '/v1/embeddings', input: { requests: [...inputs.slice(1), { ...inputs[0], encoding_format: 'base64' }] } });
    const c = await create({
      endpoint: '/v1/completions',
      params: { max_tokens: 8 },
      input: {
        requests: [
          { id: 'p1', prompt: 'Once' },
          { id: 'p2', prompt: [5, 6] },
        ],
      },
    });
    expect([e.status, c.status]).toEqual(['completed', 'completed']);

    const duck = await (await DuckDBInstance.create(':memory:')).connect();
    const folder = fileURLToPath(e.output_uri);
    const manifest = JSON.parse(readFileSync(join(folder, 'manifest.json'), 'utf8'));
    const shards = manifest.files.filter((f: any) => f.kind === 'parquet');
    expect(new Set(shards.map((f: any) => f.split))).toEqual(new Set(['train', 'eval']));
    const paths = shards.map((f: any) => `'${join(folder, f.key)}'`).join(',');
    const types = await duck.runAndReadAll(`select column_name, column_type from (describe select * from read_parquet([${paths}]))`);
    const typeOf = Object.fromEntries(types.getRowObjectsJson().map((r: any) => [r.column_name, r.column_type]));
    expect(typeOf).toMatchObject({ custom_id: 'VARCHAR', input: 'VARCHAR', embedding: 'FLOAT[]', split: 'VARCHAR', attempts: 'INTEGER' });
    expect(typeOf).not.toHaveProperty('messages');
    const rows = (
      await duck.runAndReadAll(`select custom_id, input, embedding, split from read_parquet([${paths}]) order by custom_id`)
    ).getRowObjectsJson() as any[];
    expect(rows.map((r) => r.custom_id).sort()).toEqual(inputs.map((i) => i.id).sort());
    for (const r of rows) {
      expect(r.input).toBe(inputs.find((i) => i.id === r.custom_id)!.input);
      expect(r.embedding).toHaveLength(SIM_DIMENSIONS);
      // The simulator's vectors are unit vectors: the floats are the vector, not bytes or text.
      expect(Math.hypot(...r.embedding.map(Number))).toBeCloseTo(1, 4);
    }
    // Exported as one file, in its own format and as JSON lines: the same vectors.
    const exported = await fetch(`${server.url}/v1/runs/${e.id}/export`, { headers: auth });
    expect(exported.status, exported.status === 200 ? '' : await exported.clone().text()).toBe(200);
    const whole = join(folder, '..', `${e.id}.parquet`);
    writeFileSync(whole, Buffer.from(await exported.arrayBuffer()));
    const back = (await duck.runAndReadAll(`select custom_id, embedding from read_parquet('${whole}') order by custom_id`)).getRowObjectsJson() as any[];
    expect(back.map((r) => [r.custom_id, r.embedding])).toEqual(rows.map((r) => [r.custom_id, r.embedding]));
    const asLines = await fetch(`${server.url}/v1/runs/${e.id}/export?format=jsonl`, { headers: auth });
    expect(asLines.status).toBe(200);
    const lines = (await asLines.text())
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines).toHaveLength(inputs.length);
    expect(lines.every((l) => Array.isArray(l.embedding) && l.embedding.length === SIM_DIMENSIONS)).toBe(true);

    const card = readFileSync(join(folder, 'README.md'), 'utf8');
    expect(card).toContain('Embeddings computed by the model');
    expect(card).toMatch(/- name: "embedding"\n\s+sequence: "float32"/);
    expect(card).not.toContain('"messages"');

    const cFolder = fileURLToPath(c.output_uri);
    const cShards = JSON.parse(readFileSync(join(cFolder, 'manifest.json'), 'utf8')).files.filter((f: any) => f.kind === 'parquet');
    const cPaths = cShards.map((f: any) => `'${join(cFolder, f.key)}'`).join(',');
    const cRows = (await duck.runAndReadAll(`select custom_id, prompt, text from read_parquet([${cPaths}]) order by custom_id`)).getRowObjectsJson() as any[];
    expect(cRows.map((r) => [r.custom_id, r.prompt])).toEqual([
      ['p1', 'Once'],
      ['p2', '[5,6]'],
    ]);
    expect(cRows.every((r) => typeof r.text === 'string' && r.text.length > 0)).toBe(true);
    // The sample route reads a Parquet completion's text back.
    const sample = await api(`/v1/runs/${c.id}/samples/p1`);
    expect(sample.status, JSON.stringify(sample.body)).toBe(200);
    expect(sample.body.output).toMatchObject({ content: cRows[0].text });
  });

  it("keeps an embeddings run's vectors one size when a server of another size serves the same model name", async () => {
    const other = await spawnSimulator({ model: MODEL, 'max-running': 8, 'ttft-ms': 5, 'embedding-dimensions': SIM_DIMENSIONS / 2 });
    const ep = await api('/v1/endpoints', { method: 'POST', json: { url: other.url } });
    try {
      expect(ep.status, JSON.stringify(ep.body)).toBeLessThan(300);
      await waitFor('the second endpoint to be ready', async () => ((await api(`/v1/endpoints/${ep.body.id}`)).body.state === 'ready' ? true : undefined));
      const res = await api('/v1/runs', {
        method: 'POST',
        json: { model: MODEL, endpoint: '/v1/embeddings', input: { requests: Array.from({ length: 40 }, (_, i) => ({ id: `v${i}`, input: `vector ${i}` })) } },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(201);
      const run = await finished(res.body.id);
      const folder = fileURLToPath(run.output_uri);
      const manifest = JSON.parse(readFileSync(join(folder, 'manifest.json'), 'utf8'));
      const written = manifest.files
        .filter((f: any) => f.kind === 'jsonl')
        .flatMap((f: any) =>
          readFileSync(join(folder, f.key), 'utf8')
            .trimEnd()
            .split('\n')
            .map((l: string) => JSON.parse(l)),
        );
      expect(written.length).toBeGreaterThan(0);
      const sizes = new Set(written.map((l: any) => l.embedding.length));
      expect(sizes.size, `sizes written: ${[...sizes]}`).toBe(1);
      // Both servers were asked: the other size was met and refused, not merely never seen.
      const asked = async (url: string) => ((await call(url, '/sim/stats')).body as { requests: number }).requests;
      expect(await asked(other.url)).toBeGreaterThan(0);
      expect(await asked(sim.url)).toBeGreaterThan(0);
    } finally {
      await api(`/v1/endpoints/${ep.body.id}`, { method: 'DELETE' });
      await other.stop();
    }
  });

  it('refuses what a raw run cannot do, naming the field', async () => {
    const refused = async (json: Record<string, unknown>, field: string) => {
      const res = await api('/v1/runs', { method: 'POST', json: { model: MODEL, input: { requests: [{ prompt: 'x' }] }, ...json } });
      expect(res.status, JSON.stringify(res.body)).toBe(422);
      expect(res.body.field).toBe(field);
    };
    await refused({ endpoint: '/v1/completions', regenerate: 'last_assistant' }, 'regenerate');
    await refused({ endpoint: '/v1/embeddings', output: { format: 'conversations' } }, 'output.format');
    await refused({ endpoint: '/v1/responses' }, 'endpoint');
  });
});
