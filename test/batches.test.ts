// OpenAI's Batch API, driven by the official `openai` SDK as any existing batch client would.
import { createHash } from 'node:crypto';
import { eq } from 'drizzle-orm';
import OpenAI, { APIError, AuthenticationError, BadRequestError, NotFoundError, toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, waitFor } from './support/server.js';

const MODEL = 'qwen3-sim';
const TOKEN = 'batch-test-token';
const FAST = { 'ttft-ms': 5, 'tokens-per-second': 5000 };
// ~100 ms to the first token and 96 tokens at 100/s: about a second a request, eight at a time.
const SLOW = { 'ttft-ms': 100, 'tokens-per-second': 100 };

let server: Awaited<ReturnType<typeof startTestServer>>;
let sim: SimProcess;
let client: OpenAI;
const auth = { authorization: `Bearer ${TOKEN}` };

const digestOf = (messages: unknown[]) => createHash('sha256').update(JSON.stringify(messages)).digest('hex').slice(0, 16);

type Message = { role: string; content: string };
interface Line {
  custom_id: string;
  method: 'POST';
  url: string;
  body: { model: string; messages: Message[]; [k: string]: unknown };
}

function batchLines(n: number, tag: string, body: Record<string, unknown> = {}): Line[] {
  return Array.from({ length: n }, (_, i) => ({
    custom_id: `${tag}-${i}`,
    method: 'POST' as const,
    url: '/v1/chat/completions',
    body: { model: MODEL, messages: [{ role: 'user', content: `${tag} question ${i}: what is ${i} + ${i * 7}?` }], ...body },
  }));
}

const jsonl = (lines: unknown[]) => lines.map((l) => (typeof l === 'string' ? l : JSON.stringify(l))).join('\n') + '\n';

async function upload(lines: unknown[], name = 'batch.jsonl') {
  return client.files.create({ file: await toFile(Buffer.from(jsonl(lines)), name), purpose: 'batch' });
}

async function submit(lines: unknown[], metadata?: Record<string, string>) {
  const file = await upload(lines);
  return client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', metadata });
}

const TERMINAL = ['completed', 'failed', 'cancelled', 'expired'];

async function settle(id: string, ms = 60_000) {
  return waitFor(
    `batch ${id} to finish`,
    async () => {
      const b = await client.batches.retrieve(id);
      return TERMINAL.includes(b.status) ? b : undefined;
    },
    ms,
    200,
  );
}

async function content(fileId: string): Promise<any[]> {
  const text = await (await client.files.content(fileId)).text();
  expect(text.endsWith('\n')).toBe(true);
  return text
    .trimEnd()
    .split('\n')
    .map((l) => JSON.parse(l));
}

/** Each output line answers its own request: the simulator puts the digest of the messages in its answer. */
function expectAnswers(lines: any[], sent: Map<string, Line>) {
  for (const l of lines) {
    const req = sent.get(l.custom_id);
    expect(req, l.custom_id).toBeDefined();
    expect(l.id).toMatch(/^batch_req_/);
    expect(l.error).toBeNull();
    expect(l.response.status_code).toBe(200);
    expect(typeof l.response.request_id).toBe('string');
    const body = l.response.body;
    expect(body).toMatchObject({ object: 'chat.completion', model: MODEL });
    expect(typeof body.id).toBe('string');
    expect(Number.isInteger(body.created)).toBe(true);
    expect(body.choices).toHaveLength(1);
    expect(body.choices[0]).toMatchObject({ index: 0, message: { role: 'assistant' } });
    const { content: answer, reasoning_content: reasoning } = body.choices[0].message;
    const digest = digestOf(req!.body.messages);
    // A reply cut by max_tokens while thinking has only reasoning, which names the prompt too.
    if (body.choices[0].finish_reason === 'length' && answer === '') expect(reasoning.startsWith(`Reasoning about ${digest}`)).toBe(true);
    else expect(answer.startsWith(`Answer ${digest}`), l.custom_id).toBe(true);
    expect(body.usage.total_tokens).toBe(body.usage.prompt_tokens + body.usage.completion_tokens);
  }
  expect(new Set(lines.map((l) => l.id)).size).toBe(lines.length);
}

beforeAll(async () => {
  sim = await spawnSimulator({ model: MODEL, 'max-running': 8, 'context-length': 2000, ...FAST });
  server = await startTestServer({ REGEN_API_TOKENS: `other-token,${TOKEN}`, REGEN_SHARD_SIZE: '10' });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: TOKEN, maxRetries: 0 });
  const ep = await call(server.url, '/v1/endpoints', { method: 'POST', json: { url: sim.url }, headers: auth });
  expect(ep.status, JSON.stringify(ep.body)).toBeLessThan(300);
  // Lines are checked against the models endpoints serve, which an endpoint tells on its first probe.
  await waitFor('the endpoint to be ready', async () => {
    const e = await call(server.url, `/v1/endpoints/${ep.body.id}`, { headers: auth });
    return e.body.state === 'ready' ? e.body : undefined;
  });
});

afterAll(async () => {
  await server?.cleanup();
  await sim?.stop();
});

describe('auth', () => {
  it('refuses a wrong key with AuthenticationError', async () => {
    const wrong = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'not-a-token', maxRetries: 0 });
    await expect(wrong.batches.list()).rejects.toBeInstanceOf(AuthenticationError);
    await expect(wrong.batches.list()).rejects.toMatchObject({
      message: expect.stringMatching(/^401 a valid "Authorization: Bearer <token>" header is required/),
    });
    await expect(wrong.files.create({ file: await toFile(Buffer.from('{}\n'), 'x.jsonl'), purpose: 'batch' })).rejects.toBeInstanceOf(AuthenticationError);
  });
});

describe('files through the SDK', () => {
  it('uploads, retrieves, lists, downloads and deletes', async () => {
    const text = jsonl(batchLines(3, 'files'));
    const created = await client.files.create({ file: await toFile(Buffer.from(text), 'in.jsonl'), purpose: 'batch' });
    expect(created).toMatchObject({ object: 'file', bytes: Buffer.byteLength(text), filename: 'in.jsonl', purpose: 'batch', status: 'processed' });
    expect(await client.files.retrieve(created.id)).toEqual(created);
    expect(await client.files.waitForProcessing(created.id)).toEqual(created);
    expect(await (await client.files.content(created.id)).text()).toBe(text);
    const listed = [];
    for await (const f of client.files.list({ limit: 1 })) listed.push(f.id);
    expect(listed).toContain(created.id);
    expect(await client.files.delete(created.id)).toEqual({ id: created.id, object: 'file', deleted: true });
    await expect(client.files.retrieve(created.id)).rejects.toBeInstanceOf(NotFoundError);
  });
});

describe('a batch', () => {
  it('runs every request as a run and returns OpenAI output lines, each answering its own request', async () => {
    const lines = batchLines(45, 'full');
    // A line's own body params override the run's defaults: this one is cut short.
    lines[7].body.max_tokens = 8;
    const sent = new Map(lines.map((l) => [l.custom_id, l]));
    const before = Math.floor(Date.now() / 1000);
    const created = await submit(lines, { team: 'data' });
    expect(created).toMatchObject({
      object: 'batch',
      endpoint: '/v1/chat/completions',
      completion_window: '24h',
      status: 'validating',
      model: MODEL,
      errors: null,
      output_file_id: null,
      error_file_id: null,
      metadata: { team: 'data' },
    });
    expect(created.id).toMatch(/^batch_/);
    expect(created.created_at).toBeGreaterThanOrEqual(before);
    expect(created.expires_at).toBe(created.created_at + 24 * 3600);

    const done = await settle(created.id);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toEqual({ total: 45, completed: 45, failed: 0 });
    expect(done.error_file_id).toBeNull();
    expect(done.errors).toBeNull();
    for (const t of ['in_progress_at', 'finalizing_at', 'completed_at'] as const) {
      expect(done[t], t).toBeGreaterThanOrEqual(done.created_at);
      expect(done[t], t).toBeLessThanOrEqual(Math.ceil(Date.now() / 1000));
    }
    expect(done.in_progress_at!).toBeLessThanOrEqual(done.finalizing_at!);
    expect(done.finalizing_at!).toBeLessThanOrEqual(done.completed_at!);
    for (const t of ['failed_at', 'expired_at', 'cancelling_at', 'cancelled_at'] as const) expect(done[t], t).toBeNull();

    const out = await content(done.output_file_id!);
    expect(out).toHaveLength(45);
    expect(out.map((l) => l.custom_id)).toEqual(lines.map((l) => l.custom_id));
    expectAnswers(out, sent);
    expect(out[7].response.body.choices[0].finish_reason).toBe('length');
    expect(out[6].response.body.choices[0].finish_reason).toBe('stop');

    const file = await client.files.retrieve(done.output_file_id!);
    const raw = await (await client.files.content(done.output_file_id!)).text();
    expect(file).toMatchObject({ id: done.output_file_id, object: 'file', purpose: 'batch_output', bytes: Buffer.byteLength(raw), status: 'processed' });
    // Made again from the shards on each read, byte for byte the same.
    expect(await (await client.files.content(done.output_file_id!)).text()).toBe(raw);

    // Underneath it is a run, with the batch's model and its id for a name.
    const listed = await call(server.url, '/v1/runs?limit=1000', { headers: auth });
    const run = listed.body.data.find((r: any) => r.name === created.id);
    expect(run).toMatchObject({ model: MODEL, status: 'completed', metadata: { team: 'data' }, request_counts: { total: 45, completed: 45 } });
    expect(run.shards).toEqual({ total: 5, uploaded: 5 });
  });

  it('refuses what it cannot run with the SDK error the status maps to, its message and param set', async () => {
    const file = await upload(batchLines(2, 'refused'));
    const refusal = async (p: Promise<unknown>) => {
      const e = await p.then(
        () => expect.unreachable('the request was accepted'),
        (err: unknown) => err,
      );
      expect(e).toBeInstanceOf(APIError);
      return e as APIError;
    };

    // OpenAI answers 400 to a parameter it refuses; the SDK reads message and param from its envelope.
    const endpoint = await refusal(client.batches.create({ input_file_id: file.id, endpoint: '/v1/responses', completion_window: '24h' }));
    expect(endpoint).toBeInstanceOf(BadRequestError);
    expect(endpoint.status).toBe(400);
    expect(endpoint.param).toBe('endpoint');
    expect((endpoint.error as any).message).toMatch(/^endpoint: "\/v1\/responses" is not supported: regen runs "\/v1\/chat\/completions", /);
    expect(endpoint.message).toContain((endpoint.error as any).message);

    const window = await refusal(client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '1d' as '24h' }));
    expect(window).toBeInstanceOf(BadRequestError);
    expect(window.param).toBe('completion_window');

    const noModel = await upload([{ custom_id: 'a', method: 'POST', url: '/v1/chat/completions', body: { messages: [{ role: 'user', content: 'hi' }] } }]);
    const unnamed = await refusal(client.batches.create({ input_file_id: noModel.id, endpoint: '/v1/chat/completions', completion_window: '24h' }));
    expect(unnamed).toBeInstanceOf(BadRequestError);
    expect(unnamed.param).toBe('input_file_id');
    expect(unnamed.message).toMatch(/no valid request with a body\.model/);

    const noFile = await refusal(client.batches.create({ input_file_id: 'file_doesnotexist', endpoint: '/v1/chat/completions', completion_window: '24h' }));
    expect(noFile).toBeInstanceOf(NotFoundError);
    expect(noFile.param).toBe('input_file_id');

    const unknown = await refusal(client.batches.retrieve('batch_unknown'));
    expect(unknown).toBeInstanceOf(NotFoundError);
    expect((unknown.error as any).message).toBe('batch "batch_unknown" does not exist');
    expect(unknown.message).toBe('404 batch "batch_unknown" does not exist');
    expect(unknown.type).toBe('invalid_request_error');
    expect(unknown.code).toBe('not_found');

    const noUpload = await refusal(client.files.retrieve('file_unknown'));
    expect(noUpload).toBeInstanceOf(NotFoundError);
    expect(noUpload.message).toBe('404 file "file_unknown" does not exist');
  });

  it('lists invalid lines in errors and in the error file, with failed requests, and runs the rest', async () => {
    const good = batchLines(6, 'mixed');
    const tooLong: Line = { ...batchLines(1, 'long')[0], custom_id: 'too-long' };
    tooLong.body.messages = [{ role: 'user', content: 'word '.repeat(5000) }];
    const input = [
      good[0],
      'this is not json',
      good[1],
      { ...good[2], custom_id: 'other-model', body: { ...good[2].body, model: 'another-model' } },
      good[3],
      { ...good[4], custom_id: good[0].custom_id },
      { ...good[4], custom_id: 'bad-url', url: '/v1/embeddings' },
      good[5],
      tooLong,
    ];
    const done = await settle((await submit(input)).id);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toEqual({ total: 9, completed: 4, failed: 5 });
    const errors = done.errors!.data!;
    expect(errors.map((e) => [e.line, e.code, e.param])).toEqual([
      [2, 'invalid_json_line', null],
      [4, 'mismatched_model', 'body.model'],
      [6, 'duplicate_custom_id', 'custom_id'],
      [7, 'mismatched_endpoint', 'url'],
    ]);
    for (const e of errors) expect(e.message?.length).toBeGreaterThan(0);

    expectAnswers(await content(done.output_file_id!), new Map(good.map((l) => [l.custom_id, l])));
    const errorLines = await content(done.error_file_id!);
    expect(errorLines).toHaveLength(5);
    const byCode = new Map(errorLines.map((l) => [l.error.code, l]));
    expect([...byCode.keys()].sort()).toEqual(
      ['duplicate_custom_id', 'invalid_json_line', 'invalid_request', 'mismatched_endpoint', 'mismatched_model'].sort(),
    );
    expect(byCode.get('mismatched_model')).toMatchObject({ custom_id: 'other-model', response: null });
    expect(byCode.get('invalid_json_line')!.error.message).toMatch(/^line 2: /);
    // The sample the server refused keeps its HTTP answer.
    const refused = errorLines.find((l) => l.custom_id === 'too-long');
    expect(refused.response.status_code).toBe(400);
    expect(refused.error.code).toBe('invalid_request');
    expect(refused.error.message).toMatch(/context length/);
    expect(new Set(errorLines.map((l) => l.id)).size).toBe(5);
  });

  it('fails a batch whose model no endpoint serves, line by line', async () => {
    const lines = batchLines(3, 'unserved', { model: 'no-such-model' });
    const created = await submit(lines);
    expect(created.model).toBe('no-such-model');
    const done = await settle(created.id);
    expect(done.status).toBe('failed');
    expect(done.failed_at).toBeGreaterThanOrEqual(done.created_at);
    expect(done.errors!.data!.map((e) => [e.line, e.code, e.param])).toEqual([
      [1, 'model_not_found', 'body.model'],
      [2, 'model_not_found', 'body.model'],
      [3, 'model_not_found', 'body.model'],
    ]);
    expect(done.request_counts).toEqual({ total: 3, completed: 0, failed: 3 });
    expect(done.output_file_id).toBeNull();
    expect((await content(done.error_file_id!)).map((l) => l.error.code)).toEqual(['model_not_found', 'model_not_found', 'model_not_found']);
  });
});

describe('listing', () => {
  it('pages newest first with first_id, last_id and has_more', async () => {
    const made: string[] = [];
    for (let i = 0; i < 3; i++) made.push((await submit(batchLines(1, `list-${i}`))).id);
    const all: string[] = [];
    for await (const b of client.batches.list({ limit: 2 })) all.push(b.id);
    expect(all).toEqual([...all].sort().reverse());
    expect(all.slice(0, 3)).toEqual([...made].reverse());
    expect(new Set(all).size).toBe(all.length);

    const first = await call(server.url, '/v1/batches?limit=2', { headers: auth });
    expect(first.body).toMatchObject({ object: 'list', first_id: made[2], last_id: made[1], has_more: true });
    const next = await call(server.url, `/v1/batches?limit=2&after=${made[1]}`, { headers: auth });
    expect(next.body.first_id).toBe(made[0]);
    expect(next.body.data[0].id).toBe(made[0]);
    const past = await call(server.url, `/v1/batches?after=${all.at(-1)}`, { headers: auth });
    expect(past.body).toEqual({ object: 'list', data: [], first_id: null, last_id: null, has_more: false });
    // A cursor it cannot place is a 400 naming after, as OpenAI's other refusals.
    for (const after of ['batch_0', `batch_${'z'.repeat(58)}`, made[0]!.replace('batch_', 'run_')]) {
      const forged = await call(server.url, `/v1/batches?after=${after}`, { headers: auth });
      expect(forged.status, after).toBe(400);
      expect(forged.body.error).toMatchObject({ type: 'invalid_request_error', param: 'after' });
    }
    await expect(client.batches.list({ after: 'batch_0' })).rejects.toBeInstanceOf(BadRequestError);
    for (const id of made) await settle(id);
  });
});

describe('stopping early', () => {
  it('cancels mid-batch and keeps the answers so far', async () => {
    await sim.configure({ ttftMs: SLOW['ttft-ms'], tokensPerSecond: SLOW['tokens-per-second'] });
    try {
      const lines = batchLines(40, 'cancel');
      const created = await submit(lines);
      await waitFor('a few answers', async () => {
        const b = await client.batches.retrieve(created.id);
        return b.request_counts!.completed >= 3 ? b : undefined;
      });
      const cancelling = await client.batches.cancel(created.id);
      expect(['cancelling', 'cancelled']).toContain(cancelling.status);
      expect(cancelling.cancelling_at).toBeGreaterThanOrEqual(created.created_at);

      const done = await settle(created.id);
      expect(done.status).toBe('cancelled');
      expect(done.cancelled_at).toBeGreaterThanOrEqual(done.cancelling_at!);
      const { total, completed, failed } = done.request_counts!;
      expect(total).toBe(40);
      expect(completed).toBeGreaterThanOrEqual(3);
      expect(completed).toBeLessThan(40);
      expect(completed + failed).toBe(40);

      const out = await content(done.output_file_id!);
      expect(out).toHaveLength(completed);
      expectAnswers(out, new Map(lines.map((l) => [l.custom_id, l])));
      const errorLines = await content(done.error_file_id!);
      expect(errorLines).toHaveLength(failed);
      expect(errorLines.every((l) => l.error.code === 'batch_cancelled' && l.response === null)).toBe(true);
      const answered = new Set([...out, ...errorLines].map((l) => l.custom_id));
      expect(answered.size).toBe(40);

      await expect(client.batches.cancel(created.id)).rejects.toMatchObject({ status: 409 });
    } finally {
      await sim.configure({ ttftMs: FAST['ttft-ms'], tokensPerSecond: FAST['tokens-per-second'] });
    }
  });

  it('expires when the completion window passes: answers kept, the rest in the error file as batch_expired', async () => {
    await sim.configure({ ttftMs: SLOW['ttft-ms'], tokensPerSecond: SLOW['tokens-per-second'] });
    try {
      const lines = batchLines(40, 'expire');
      const created = await submit(lines);
      await waitFor('a few answers', async () => {
        const b = await client.batches.retrieve(created.id);
        return b.request_counts!.completed >= 3 ? b : undefined;
      });
      // The window is 24 hours; move its end to now rather than wait.
      const { db } = server.deps;
      await db.write((w) =>
        w.q
          .update(db.t.runs)
          .set({ expiresAt: Date.now() - 1000 })
          .where(eq(db.t.runs.batchId, created.id)),
      );

      const done = await settle(created.id);
      expect(done.status).toBe('expired');
      expect(done.expired_at).toBeGreaterThanOrEqual(done.created_at);
      expect(done.cancelling_at).toBeNull();
      expect(done.cancelled_at).toBeNull();
      const { completed, failed } = done.request_counts!;
      expect(completed).toBeGreaterThanOrEqual(3);
      expect(completed + failed).toBe(40);
      expectAnswers(await content(done.output_file_id!), new Map(lines.map((l) => [l.custom_id, l])));
      const errorLines = await content(done.error_file_id!);
      expect(errorLines).toHaveLength(failed);
      expect(errorLines.every((l) => l.error.code === 'batch_expired')).toBe(true);
    } finally {
      await sim.configure({ ttftMs: FAST['ttft-ms'], tokensPerSecond: FAST['tokens-per-second'] });
    }
  });

  it('stays in_progress with the verdict in errors when the quality gate pauses the run', async () => {
    await sim.configure({ degenerateRate: 1 });
    try {
      // Thinking asked per line, answered with an empty think block: every sample is flagged.
      const lines = batchLines(400, 'gate', { chat_template_kwargs: { enable_thinking: true } });
      const created = await submit(lines);
      const paused = await waitFor('the gate to trip', async () => {
        const b = await client.batches.retrieve(created.id);
        expect(TERMINAL).not.toContain(b.status);
        return b.errors?.data?.some((e) => e.code === 'quality_gate') ? b : undefined;
      });
      expect(paused.status).toBe('in_progress');
      const verdict = paused.errors!.data!.find((e) => e.code === 'quality_gate')!;
      expect(verdict.message).toMatch(/^quality gate: .*missing_reasoning/);
      expect(verdict.line).toBeNull();
      const cancelled = await client.batches.cancel(created.id);
      expect(cancelled.status).toBe('cancelling');
      expect((await settle(created.id)).status).toBe('cancelled');
    } finally {
      await sim.configure({ degenerateRate: 0 });
    }
  });
});
