// Every body of regen's OpenAI layer (Files and Batch routes, the batch output and error lines),
// checked against OpenAI's own published schemas (test/fixtures/openai-openapi).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { missingProperties, openaiViolations } from './support/openai-schemas.js';
import { call, startTestServer, waitFor } from './support/server.js';

const MODEL = 'qwen3-sim';
const TOKEN = 'schema-test-token';
const auth = { authorization: `Bearer ${TOKEN}` };
// A prompt over the simulator's context, which it refuses with a 400 as SGLang does.
const CONTEXT_TOKENS = 2000;
const TERMINAL = ['completed', 'failed', 'cancelled', 'expired'];

let server: Awaited<ReturnType<typeof startTestServer>>;
let sim: SimProcess;

const api = (path: string, init: RequestInit & { json?: unknown } = {}) => call(server.url, path, { ...init, headers: { ...auth, ...init.headers } });

/** The body conforms to OpenAI's schema. */
function expectConforms(schema: string, body: unknown) {
  expect(openaiViolations(schema, body), JSON.stringify(body).slice(0, 500)).toEqual([]);
}

/** The body conforms and has every property the schema names (as null where regen has no value). */
function expectComplete(schema: string, body: Record<string, unknown>) {
  expectConforms(schema, body);
  expect(missingProperties(schema, body)).toEqual([]);
}

/** An error in OpenAI's envelope, its status and `param` as OpenAI would answer. */
function expectOpenAIError(res: { status: number; body: any }, status: number, param: string | null = null) {
  expect(res.status, JSON.stringify(res.body)).toBe(status);
  expectConforms('ErrorResponse', res.body);
  expect(res.body.error.message).toBe(res.body.detail);
  expect(res.body.error.param).toBe(param);
  expect(res.body.error.type).toBe(status >= 500 ? 'server_error' : 'invalid_request_error');
  expect(res.body.status).toBe(status);
}

function line(customId: string, content: string) {
  return { custom_id: customId, method: 'POST', url: '/v1/chat/completions', body: { model: MODEL, messages: [{ role: 'user', content }], max_tokens: 16 } };
}

async function uploadBatchFile(lines: unknown[]) {
  const form = new FormData();
  form.append('purpose', 'batch');
  const text = lines.map((l) => (typeof l === 'string' ? l : JSON.stringify(l))).join('\n') + '\n';
  form.append('file', new Blob([text]), 'batch.jsonl');
  const res = await api('/v1/files', { method: 'POST', body: form });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body;
}

const createBatch = (input_file_id: string) =>
  api('/v1/batches', { method: 'POST', json: { input_file_id, endpoint: '/v1/chat/completions', completion_window: '24h' } });

async function settle(id: string) {
  return waitFor(`batch ${id} to finish`, async () => {
    const b = await api(`/v1/batches/${id}`);
    return TERMINAL.includes(b.body.status) ? b.body : undefined;
  });
}

async function jsonLines(fileId: string): Promise<any[]> {
  const res = await fetch(`${server.url}/v1/files/${fileId}/content`, { headers: auth });
  expect(res.status).toBe(200);
  return (await res.text())
    .trimEnd()
    .split('\n')
    .map((l) => JSON.parse(l));
}

beforeAll(async () => {
  // Cache reports on, so that a batch's cached tokens have something to total.
  sim = await spawnSimulator({
    model: MODEL,
    'max-running': 8,
    'context-length': CONTEXT_TOKENS,
    'ttft-ms': 5,
    'tokens-per-second': 5000,
    'enable-cache-report': 1,
  });
  server = await startTestServer({ REGEN_API_TOKENS: TOKEN, REGEN_SHARD_SIZE: '4' });
  const ep = await api('/v1/endpoints', { method: 'POST', json: { url: sim.url } });
  expect(ep.status, JSON.stringify(ep.body)).toBeLessThan(300);
  await waitFor('the endpoint to be ready', async () => ((await api(`/v1/endpoints/${ep.body.id}`)).body.state === 'ready' ? true : undefined));
});

afterAll(async () => {
  await server?.cleanup();
  await sim?.stop();
});

describe("OpenAI's schemas, as the test holds them", () => {
  it('refuse what OpenAI refuses: a choice without logprobs or refusal, an RFC 3339 created_at, an error without a message', () => {
    const choice = { index: 0, message: { role: 'assistant', content: 'hi' }, finish_reason: 'stop' };
    const body = { id: 'chatcmpl-1', object: 'chat.completion', created: 1764684000, model: MODEL, choices: [choice] };
    expect(openaiViolations('CreateChatCompletionResponse', body).join('\n')).toMatch(/choices\/0 must have required property 'logprobs'/);
    expect(openaiViolations('CreateChatCompletionResponse', body).join('\n')).toMatch(/message must have required property 'refusal'/);
    const file = { id: 'file_1', object: 'file', bytes: 1, created_at: '2026-12-02T14:00:00.000Z', filename: 'a.jsonl', purpose: 'batch', status: 'processed' };
    expect(openaiViolations('OpenAIFile', file)).toEqual([expect.stringMatching(/^OpenAIFile\/created_at must be integer/)]);
    expect(openaiViolations('ErrorResponse', { type: 'about:blank', title: 'Not Found', status: 404, detail: 'no' })).not.toEqual([]);
    // Null only where OpenAI sends it: a required field stays a string.
    expect(
      openaiViolations('Batch', { id: 'b', object: 'batch', endpoint: null, input_file_id: 'f', completion_window: '24h', status: 'completed', created_at: 1 }),
    ).toEqual([expect.stringMatching(/^Batch\/endpoint must be string/)]);
  });
});

describe('the Files routes', () => {
  it('answer upload, get, list, content and delete in OpenAI shapes', async () => {
    const lines = [line('f-1', 'one')];
    const file = await uploadBatchFile(lines);
    expectComplete('OpenAIFile', file);
    const got = await api(`/v1/files/${file.id}`);
    expectComplete('OpenAIFile', got.body);
    expect(got.body).toEqual(file);

    const listed = await api('/v1/files?purpose=batch&limit=1');
    expectConforms('ListFilesResponse', listed.body);
    expect(listed.body).toMatchObject({ first_id: file.id, last_id: file.id });
    const empty = await api('/v1/files?purpose=user_data');
    expectConforms('ListFilesResponse', empty.body);
    expect(empty.body).toEqual({ object: 'list', data: [], has_more: false, first_id: null, last_id: null });

    const content = await api(`/v1/files/${file.id}/content`);
    expect(content.body).toEqual(lines[0]);

    const deleted = await api(`/v1/files/${file.id}`, { method: 'DELETE' });
    expectConforms('DeleteFileResponse', deleted.body);
  });

  it("give a raw upload regen's own purpose, the one field outside OpenAI's File schema", async () => {
    const raw = await api('/v1/files', { method: 'POST', body: '{"prompt":"hi"}\n', headers: { 'content-type': 'application/jsonl' } });
    expect(raw.status).toBe(201);
    expect(openaiViolations('OpenAIFile', raw.body)).toEqual([expect.stringMatching(/^OpenAIFile\/purpose must be equal to one of the allowed values/)]);
  });

  it("answer errors in OpenAI's envelope with OpenAI's status codes", async () => {
    expectOpenAIError(await api('/v1/files/file_doesnotexist'), 404);
    expectOpenAIError(await api('/v1/files/file_doesnotexist/content'), 404);
    expectOpenAIError(await api('/v1/files/file_doesnotexist', { method: 'DELETE' }), 404);
    expectOpenAIError(await api('/v1/files/bad.id'), 400, 'id');
    expectOpenAIError(await api('/v1/files?limit=0'), 400, 'limit');
    expectOpenAIError(await api('/v1/files?filename=', { method: 'POST', body: 'x\n', headers: { 'content-type': 'application/jsonl' } }), 400, 'filename');
    expectOpenAIError(await api('/v1/files', { method: 'POST', body: 'x', headers: { 'content-type': 'image/png' } }), 415);
    expectOpenAIError(await call(server.url, '/v1/files'), 401);
    const form = new FormData();
    form.append('purpose', 'batch');
    expectOpenAIError(await api('/v1/files', { method: 'POST', body: form }), 400, 'file');
  });
});

describe('the Batch routes', () => {
  it('answer create, get and list, and write output and error lines, in OpenAI shapes', async () => {
    const tooLong = line('too-long', 'word '.repeat(CONTEXT_TOKENS * 2));
    const withLogprobs = line('logprobs', 'four');
    Object.assign(withLogprobs.body, { logprobs: true, top_logprobs: 2 });
    const input = [line('b-1', 'one'), 'this is not json', line('b-2', 'two'), tooLong, line('b-3', 'three'), withLogprobs];
    const file = await uploadBatchFile(input);
    const created = await createBatch(file.id);
    expect(created.status).toBe(200);
    expectComplete('Batch', created.body);
    expectComplete('Batch', (await api(`/v1/batches/${created.body.id}`)).body);
    const listed = await api('/v1/batches?limit=1');
    expectConforms('ListBatchesResponse', listed.body);
    for (const b of listed.body.data) expectComplete('Batch', b);
    const past = await api(`/v1/batches?after=${created.body.id}`);
    expectConforms('ListBatchesResponse', past.body);
    expect(past.body).toMatchObject({ data: [], first_id: null, last_id: null });

    const done = await settle(created.body.id);
    expectComplete('Batch', done);
    expect(done.request_counts).toEqual({ total: 6, completed: 4, failed: 2 });

    const outputFile = await api(`/v1/files/${done.output_file_id}`);
    expectComplete('OpenAIFile', outputFile.body);
    const out = await jsonLines(done.output_file_id);
    expect(out).toHaveLength(4);
    for (const l of out) {
      expectConforms('BatchRequestOutput', l);
      expectConforms('CreateChatCompletionResponse', l.response.body);
      // regen's addition beside OpenAI's message: the reasoning, kept apart from the answer.
      expect(l.response.body.choices[0].message).toHaveProperty('reasoning_content');
    }
    // Log probabilities as the server sent them, one a completion token, where the request asked.
    const [asked, ...others] = [out.find((l) => l.custom_id === 'logprobs'), ...out.filter((l) => l.custom_id !== 'logprobs')];
    const { logprobs } = asked.response.body.choices[0];
    expect(logprobs.content).toHaveLength(asked.response.body.usage.completion_tokens);
    expect(logprobs.content[0].top_logprobs).toHaveLength(2);
    expect(logprobs.refusal).toBeNull();
    for (const l of others) expect(l.response.body.choices[0].logprobs).toBeNull();

    // The batch's usage is its run's: every answer's tokens, those of answers the quality checks retried too
    // (max_tokens 16 cuts each answer short, which is flagged and retried once; the retry's prompt is a
    // repeat, which the simulator reports cached).
    const run = (await api('/v1/runs?limit=1000')).body.data.find((r: any) => r.name === done.id);
    const sum = (f: (u: any) => number) => out.reduce((n, l) => n + f(l.response.body.usage), 0);
    expect(done.usage).toEqual({
      input_tokens: run.usage.prompt_tokens,
      input_tokens_details: { cached_tokens: expect.any(Number) },
      output_tokens: run.usage.completion_tokens,
      output_tokens_details: { reasoning_tokens: run.usage.reasoning_tokens },
      total_tokens: run.usage.prompt_tokens + run.usage.completion_tokens,
    });
    expect(done.usage.input_tokens).toBeGreaterThanOrEqual(sum((u) => u.prompt_tokens));
    expect(sum((u) => u.prompt_tokens_details.cached_tokens)).toBeGreaterThan(0);
    expect(done.usage.input_tokens_details.cached_tokens).toBeGreaterThanOrEqual(sum((u) => u.prompt_tokens_details.cached_tokens));
    expect(done.usage.output_tokens).toBeGreaterThanOrEqual(sum((u) => u.completion_tokens));

    expectComplete('OpenAIFile', (await api(`/v1/files/${done.error_file_id}`)).body);
    const errors = await jsonLines(done.error_file_id);
    expect(errors.map((l) => l.error.code).sort()).toEqual(['invalid_json_line', 'invalid_request']);
    for (const l of errors) {
      expectConforms('BatchRequestOutput', l);
      if (l.response) expectConforms('ErrorResponse', l.response.body);
    }
    expect(errors.find((l) => l.custom_id === 'too-long').response.status_code).toBe(400);

    // A finished batch cannot be cancelled: 409 in OpenAI's envelope.
    expectOpenAIError(await api(`/v1/batches/${done.id}/cancel`, { method: 'POST' }), 409);
  });

  it('answer cancel in OpenAI shapes, with the unanswered requests in the error file', async () => {
    const file = await uploadBatchFile([line('c-1', 'one'), line('c-2', 'two')]);
    // Answers slower than the cancel, so that it finds the batch under way (at the file's 5 ms, two
    // answers could be in before the cancel reached the server, which then refused it: 409).
    await sim.configure({ ttftMs: 60_000 });
    let done: any;
    try {
      const created = await createBatch(file.id);
      // Cancelled under way, so its requests are in flight and its error file lists them (a batch
      // cancelled while its input validates ends with no requests at all).
      await waitFor('the batch under way', async () => ((await api(`/v1/batches/${created.body.id}`)).body.status === 'in_progress' ? true : undefined));
      const cancelled = await api(`/v1/batches/${created.body.id}/cancel`, { method: 'POST' });
      expect(cancelled.status).toBe(200);
      expectComplete('Batch', cancelled.body);
      done = await settle(created.body.id);
    } finally {
      await sim.configure({ ttftMs: 5 });
    }
    expectComplete('Batch', done);
    expect(done.status).toBe('cancelled');
    for (const id of [done.output_file_id, done.error_file_id].filter(Boolean)) {
      for (const l of await jsonLines(id)) expectConforms('BatchRequestOutput', l);
    }
  });

  it("answer errors in OpenAI's envelope with OpenAI's status codes", async () => {
    const file = await uploadBatchFile([line('e-1', 'one')]);
    expectOpenAIError(await api('/v1/batches/batch_doesnotexist'), 404);
    expectOpenAIError(await api('/v1/batches/batch_doesnotexist/cancel', { method: 'POST' }), 404);
    expectOpenAIError(await api('/v1/batches/bad.id'), 400, 'id');
    expectOpenAIError(await api('/v1/batches?limit=101'), 400, 'limit');
    const bad = (json: object) =>
      api('/v1/batches', { method: 'POST', json: { input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', ...json } });
    expectOpenAIError(await bad({ endpoint: '/v1/responses' }), 400, 'endpoint');
    expectOpenAIError(await bad({ completion_window: '1d' }), 400, 'completion_window');
    expectOpenAIError(await bad({ input_file_id: 'file_doesnotexist' }), 404, 'input_file_id');
    expectOpenAIError(await api('/v1/batches', { method: 'POST', body: '{', headers: { 'content-type': 'application/json' } }), 400);
    expectOpenAIError(await call(server.url, '/v1/batches'), 401);
    expectOpenAIError(await api('/v1/batches/batch_x/nothing-here'), 404);
  });
});

describe("regen's own API", () => {
  it('keeps problem+json without the OpenAI envelope, and 422 for a refused field', async () => {
    const res = await api('/v1/runs?limit=0');
    expect(res.status).toBe(422);
    expect(res.body).toMatchObject({ code: 'validation_failed', field: 'limit' });
    expect(res.body).not.toHaveProperty('error');
  });
});
