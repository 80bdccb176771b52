// Completions and embeddings lines (domain/raw-request.ts), their bodies, and an embedding answer
// read and checked (runner/raw-requests.ts): the policy cases of test/batch-endpoints.test.ts.
import { describe, expect, it } from 'vitest';
import { parseInputLine } from '../../src/domain/input-line.js';
import { encodeEmbedding } from '../../src/domain/run-endpoint.js';
import { buildRequest } from '../../src/runner/request.js';
import { AnswerReader, parseEmbedding } from '../../src/runner/raw-requests.js';
import type { AnswerLimits } from '../../src/runner/request.js';

const completions = { regenerate: null, choicesInBody: true, endpoint: '/v1/completions' } as const;
const embeddings = { regenerate: null, choicesInBody: true, endpoint: '/v1/embeddings' } as const;
const parse = (line: unknown, opts: Parameters<typeof parseInputLine>[2]) => parseInputLine(JSON.stringify(line), 3, opts);
const batchLine = (url: string, body: Record<string, unknown>) => ({ custom_id: 'c', method: 'POST', url, body: { model: 'm', ...body } });

describe('a completions or embeddings line', () => {
  it("reads `input` as the request of an embeddings line only: a chat line's own `input` (Alpaca's) stays its metadata", () => {
    const chat = { regenerate: null, choicesInBody: false } as const;
    expect(parse({ custom_id: 'a', messages: [{ role: 'user', content: 'q' }], instruction: 'i', input: 'x' }, chat)).toMatchObject({
      ok: true,
      metadata: { instruction: 'i', input: 'x' },
    });
    expect(parse({ custom_id: 'e', input: 'embed me', note: 'n' }, embeddings)).toMatchObject({ ok: true, metadata: { note: 'n' } });
  });

  it('keeps a prompt or an input as the request, its other fields as params', () => {
    expect(parse(batchLine('/v1/completions', { prompt: [1, 2], echo: true, n: 2 }), completions)).toMatchObject({
      ok: true,
      raw: { prompt: [1, 2] },
      messages: [],
      model: 'm',
      params: { echo: true, n: 2 },
    });
    expect(parse({ id: 'e', input: 'embed me', params: { dimensions: 8 }, source: 'x' }, embeddings)).toMatchObject({
      ok: true,
      custom_id: 'e',
      raw: { input: 'embed me' },
      params: { dimensions: 8 },
      metadata: { source: 'x' },
    });
  });

  it('refuses what the route cannot take, naming the field', () => {
    const reason = (line: unknown, opts: Parameters<typeof parseInputLine>[2]) => {
      const p = parse(line, opts);
      return p.ok ? null : [p.code, p.reason];
    };
    expect(reason(batchLine('/v1/chat/completions', { prompt: 'x' }), completions)).toEqual([
      'mismatched_endpoint',
      `url "/v1/chat/completions" differs from the batch's endpoint "/v1/completions"`,
    ]);
    expect(reason(batchLine('/v1/completions', { messages: [{ role: 'user', content: 'x' }] }), completions)).toEqual([
      'invalid_request',
      "no body.prompt: a /v1/completions request's prompt is a text or an array of token ids: a /v1/completions request has no messages",
    ]);
    expect(reason(batchLine('/v1/completions', { prompt: [1, -2] }), completions)?.[1]).toBe('body.prompt[1] must be a token id (a whole number from 0)');
    expect(reason(batchLine('/v1/completions', { prompt: 'x', logprobs: true }), completions)?.[1]).toMatch(
      /^body\.logprobs must be a whole number from 0 to 20/,
    );
    expect(reason(batchLine('/v1/embeddings', { input: ['a', 'b'] }), embeddings)?.[1]).toMatch(/^body\.input: one input a line/);
    expect(reason(batchLine('/v1/embeddings', { input: 'a', encoding_format: 'hex' }), embeddings)?.[1]).toBe(
      'body.encoding_format must be "float" or "base64"',
    );
    expect(reason({ input: 'a', params: { dimensions: 0 } }, embeddings)?.[1]).toBe('params.dimensions must be a whole number from 1 to 65536');
    expect(reason({ input: '  ' }, embeddings)?.[1]).toBe('input must not be empty');
  });

  it('is sent raw to its route: the prompt with no chat template, an input asked as floats', () => {
    const run = { model: 'm', params: { max_tokens: 8, encoding_format: 'base64' } };
    expect(buildRequest(run, { request: JSON.stringify({ prompt: 'Once' }), qualityRetries: 0 })).toEqual({
      body: { max_tokens: 8, encoding_format: 'base64', model: 'm', prompt: 'Once' },
      thinking: false,
    });
    expect(buildRequest(run, { request: JSON.stringify({ input: [1, 2], params: { dimensions: 4 } }), qualityRetries: 0 }).body).toEqual({
      max_tokens: 8,
      dimensions: 4,
      model: 'm',
      input: [1, 2],
      encoding_format: 'float',
    });
  });
});

describe('an embedding answer', () => {
  const limits = { contextLength: 100, choices: 1 };
  const answer = (embedding: unknown, prompt_tokens: unknown = 3) => ({
    object: 'list',
    data: [{ embedding, index: 0 }],
    model: 'm',
    usage: { prompt_tokens },
  });

  it('is its vector and its prompt tokens', () => {
    expect(parseEmbedding(answer([0.6, 0.8]), limits)).toMatchObject({
      ok: true,
      answer: { embedding: [0.6, 0.8], usage: { prompt_tokens: 3, completion_tokens: 0 }, model: 'm', content: null },
    });
  });

  it('is refused as the server broken when a value is not finite, a dimension is missing, or the usage is impossible', () => {
    const message = (res: unknown, l: Parameters<typeof parseEmbedding>[1] = limits) => {
      const p = parseEmbedding(res, l);
      return p.ok ? null : [p.error.code, p.error.message];
    };
    expect(message(answer([0.1, null]))).toEqual(['malformed_response', 'the endpoint answered an embedding whose value 1 is null, not a finite number']);
    expect(message(answer([]))).toEqual(['malformed_response', 'the endpoint answered 200 without an embedding']);
    expect(message({ choices: [] })).toEqual(['malformed_response', 'the endpoint answered 200 without an embedding']);
    expect(message(answer([0.1, 0.2]), { ...limits, dimensions: 3 })).toEqual([
      'malformed_response',
      'the endpoint answered an embedding of 2 dimensions, not the 3 asked',
    ]);
    expect(message(answer([0.1], 101))?.[1]).toMatch(/usage\.prompt_tokens 101, not a whole number within the context/);
    expect(new AnswerReader().read({ id: 'r', endpoint: '/v1/embeddings' }, answer([0.1, Number.NaN]), limits, 1, 'ep')[0].ok).toBe(false);
  });

  it("holds every vector of a run to its first one's size, each run to its own, and to the size a run asks", () => {
    const reader = new AnswerReader();
    const read = (run: string, embedding: number[], l: AnswerLimits = limits) => {
      const [p] = reader.read({ id: run, endpoint: '/v1/embeddings' }, answer(embedding), l, 1, 'ep');
      return p.ok ? 'ok' : p.error.message;
    };
    expect(read('a', [0.6, 0.8])).toBe('ok');
    expect(read('a', [0, 1])).toBe('ok');
    expect(read('a', [1, 0, 0])).toBe(
      "the endpoint answered an embedding of 3 dimensions where the run's others have 2: it may serve another model of the same name",
    );
    expect(read('b', [1, 0, 0])).toBe('ok');
    expect(read('b', [1])).toMatch(/of 1 dimensions where the run's others have 3/);
    // A broken first answer teaches nothing: the next good one sets the size.
    expect(read('c', [Number.NaN, 1])).toMatch(/not a finite number/);
    expect(read('c', [1, 0, 0, 0])).toBe('ok');
    expect(read('c', [1, 0])).toMatch(/where the run's others have 4/);
    expect(read('d', [1, 0], { ...limits, dimensions: 2 })).toBe('ok');
    expect(read('d', [1, 0, 0], { ...limits, dimensions: 3 })).toBe('ok');
  });

  it("keeps a run's samples off an endpoint that answered its vectors at another size, while another endpoint has not", () => {
    const reader = new AnswerReader();
    const from = (run: string, endpoint: string, embedding: number[]) =>
      reader.read({ id: run, endpoint: '/v1/embeddings' }, answer(embedding), limits, 1, endpoint)[0].ok;
    expect(from('a', 'ep_small', [1, 0])).toBe(true);
    expect(from('a', 'ep_big', [1, 0, 0])).toBe(false);
    expect(reader.avoids('a', 'ep_big', () => ['ep_small', 'ep_big'])).toBe(true);
    expect(reader.avoids('a', 'ep_small', () => ['ep_small', 'ep_big'])).toBe(false);
    // Another run has its own size and its own endpoints.
    expect(reader.avoids('b', 'ep_big', () => ['ep_small', 'ep_big'])).toBe(false);
    // With no other endpoint left for the model, none is avoided.
    expect(reader.avoids('a', 'ep_big', () => ['ep_big'])).toBe(false);
    expect(from('a', 'ep_small', [0, 1, 0])).toBe(false);
    expect(reader.avoids('a', 'ep_big', () => ['ep_small', 'ep_big'])).toBe(false);
  });

  it("goes out in OpenAI's base64: the little-endian float32s", () => {
    const b64 = encodeEmbedding([0.5, -1], 'base64') as string;
    const bytes = Buffer.from(b64, 'base64');
    expect([bytes.readFloatLE(0), bytes.readFloatLE(4)]).toEqual([0.5, -1]);
    expect(encodeEmbedding([0.5], 'float')).toEqual([0.5]);
  });
});
