import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectProblem, request, type Raw } from './support/http.js';
import { startTestServer, waitFor } from './support/server.js';

// The API's edges, driven by the contract where they apply to every route: a wrong method, a bad
// cursor, a Last-Event-ID never sent, strings other parsers refuse, and batch error lines that keep
// the custom_id of the line they answer.

let server: Awaited<ReturnType<typeof startTestServer>>;
let doc: any;
const req = (path: string, init?: Parameters<typeof request>[2]) => request(server.url, path, init);

beforeAll(async () => {
  server = await startTestServer();
  doc = (await req('/openapi.json')).body;
});
afterAll(async () => {
  await server?.cleanup();
});

const METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'];
/** The OpenAI layer answers a refused parameter with 400, regen's own API with 422. */
const validationStatus = (path: string) => (/^\/v1\/(files|batches)/.test(path) ? 400 : 422);

function operations(): { method: string; path: string; op: any }[] {
  const ops = [];
  for (const [path, item] of Object.entries<any>(doc.paths))
    for (const [method, op] of Object.entries<any>(item)) ops.push({ method: method.toUpperCase(), path, op });
  // Every resource of the API is in the list, so a new route cannot slip by unchecked.
  expect(ops.length).toBeGreaterThanOrEqual(25);
  return ops;
}

/** A path with its parameters filled in by ids of the right shape (nothing need exist for these checks). */
function concrete(path: string, values: Record<string, string> = {}): string {
  const kind = /^\/v1\/(\w+?)e?s\//.exec(path)?.[1];
  const prefix = { run: 'run', endpoint: 'ep', file: 'file', batch: 'batch', batche: 'batch' }[kind ?? ''] ?? 'x';
  return path.replace(/\{(\w+)\}/g, (_, name: string) => values[name] ?? (name === 'id' ? `${prefix}_0nosuchid000000000000000` : 'no-such-sample'));
}

async function createRun(): Promise<string> {
  const res = await req('/v1/runs', { method: 'POST', json: { model: 'edge-model', input: { requests: [{ messages: [{ role: 'user', content: 'hi' }] }] } } });
  expect(res.status, res.text).toBe(201);
  await waitFor('the run to validate', async () => ((await req(`/v1/runs/${res.body.id}`)).body.status !== 'validating' ? true : undefined));
  return res.body.id;
}

describe('a wrong method', () => {
  it('answers 405 with Allow naming the methods the path has, on every path of openapi.json and the dashboard', async () => {
    const byPath = new Map<string, string[]>();
    for (const { method, path } of operations()) byPath.set(path, [...(byPath.get(path) ?? []), method]);
    for (const [path, documented] of byPath) {
      const allowed = new Set(documented.includes('GET') ? [...documented, 'HEAD'] : documented);
      for (const method of METHODS.filter((m) => !allowed.has(m))) {
        const res = await req(concrete(path), { method });
        expectProblem(res, 405, { code: 'method_not_allowed' });
        expect(res.headers.get('allow')?.split(', ').sort(), `${method} ${path}`).toEqual([...allowed].sort());
      }
    }
    const res = await req('/', { method: 'POST' });
    expectProblem(res, 405, { code: 'method_not_allowed' });
    expect(res.headers.get('allow')).toBe('GET, HEAD');
    // A path that does not exist stays a 404, whatever the method.
    expectProblem(await req('/v1/nothing', { method: 'DELETE' }), 404, { code: 'not_found' });
  });
});

describe('cursors', () => {
  it('a cursor no page of the list gave answers 422 (400 on the OpenAI layer) naming after, on every list', async () => {
    const runId = await createRun();
    const lists = operations().filter(({ op }) => op.parameters?.some((p: any) => p.name === 'after' && p.in === 'query'));
    expect(lists.map((l) => l.path).sort()).toEqual(['/v1/batches', '/v1/endpoints', '/v1/files', '/v1/runs', '/v1/runs/{id}/samples', '/v1/runs/{id}/shards']);
    for (const { path } of lists) {
      for (const cursor of ['garbage', 'run_', `${runId}x`.replace('run_', 'file_').toUpperCase()]) {
        const res = await req(`${concrete(path, { id: runId })}?after=${encodeURIComponent(cursor)}`);
        expectProblem(res, validationStatus(path), { field: 'after' });
      }
    }
    // The last_id of a page still pages on.
    const first = await req('/v1/runs?limit=1');
    expect((await req(`/v1/runs?after=${first.body.last_id}`)).status).toBe(200);
  });
});

describe('Last-Event-ID', () => {
  /** The first event id of a run's stream. */
  async function firstEventId(runId: string): Promise<string> {
    const ac = new AbortController();
    const res = await fetch(`${server.url}/v1/runs/${runId}/events`, { signal: ac.signal });
    const reader = res.body!.getReader();
    let text = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) throw new Error(`the stream ended without an event id: ${text}`);
        text += new TextDecoder().decode(value);
        const m = /^id: (\d+)$/m.exec(text);
        if (m) return m[1];
      }
    } finally {
      ac.abort();
    }
  }

  it('one this run never sent is refused naming it; one it sent resumes', async () => {
    const [a, b] = [await createRun(), await createRun()];
    const idOfA = await firstEventId(a);
    for (const unknown of ['0', '999999999999', idOfA]) {
      const res = await req(`/v1/runs/${b}/events`, { headers: { 'last-event-id': unknown } });
      expectProblem(res, 422, { code: 'validation_failed', field: 'last-event-id' });
    }
    const ac = new AbortController();
    const resumed = await fetch(`${server.url}/v1/runs/${a}/events`, { headers: { 'last-event-id': idOfA }, signal: ac.signal });
    expect(resumed.status).toBe(200);
    expect(resumed.headers.get('content-type')).toMatch(/^text\/event-stream/);
    ac.abort();
  });
});

type Path = (string | number)[];
const fieldPath = (path: Path) => path.reduce<string>((acc, p) => (typeof p === 'number' ? `${acc}[${p}]` : acc ? `${acc}.${p}` : p), '');

/** Every string field of a request body schema: its path (a record's values under the key `k`), and the records themselves. */
function stringFields(schema: any, path: Path = [], seen = new Set<string>()): { path: Path; record?: true }[] {
  if (!schema || path.length > 8) return [];
  if (schema.$ref) {
    const name = schema.$ref.split('/').at(-1);
    if (seen.has(name)) return [];
    return stringFields(doc.components.schemas[name], path, new Set([...seen, name]));
  }
  const out: { path: Path; record?: true }[] = [];
  for (const branch of [...(schema.anyOf ?? []), ...(schema.oneOf ?? []), ...(schema.allOf ?? [])]) out.push(...stringFields(branch, path, seen));
  const types = [schema.type].flat();
  if (types.includes('string')) out.push({ path });
  for (const [key, sub] of Object.entries<any>(schema.properties ?? {})) out.push(...stringFields(sub, [...path, key], seen));
  if (typeof schema.additionalProperties === 'object') {
    out.push({ path, record: true });
    out.push(...stringFields(schema.additionalProperties, [...path, 'k'], seen));
  }
  if (schema.items) out.push(...stringFields(schema.items, [...path, 0], seen));
  return out;
}

function withValue(path: Path, value: unknown): unknown {
  if (path.length === 0) return value;
  const [head, ...rest] = path;
  return typeof head === 'number' ? [withValue(rest, value)] : { [head]: withValue(rest, value) };
}

const BAD_STRINGS = { 'a lone surrogate': 'a\ud800b', 'a lone low surrogate': '\udc00', NUL: 'a\u0000b' };

describe('strings other parsers refuse', () => {
  it('in any string field of any JSON body, key or value, are refused with a 4xx naming the field', async () => {
    let checked = 0;
    for (const { method, path, op } of operations()) {
      const schema = op.requestBody?.content?.['application/json']?.schema;
      if (!schema) continue;
      // Free-form fields (a run's inline requests) are JSON of any shape: their strings are checked too.
      const fields = stringFields(schema);
      if (path === '/v1/runs') fields.push({ path: ['input', 'requests', 0, 'messages', 0, 'content'] });
      for (const { path: field, record } of fields) {
        for (const [what, bad] of Object.entries(BAD_STRINGS)) {
          const body = record ? withValue(field, { [bad]: 'v' }) : withValue(field, bad);
          const res: Raw = await req(concrete(path), { method, json: body });
          const name = fieldPath(field) || 'body';
          expect(res.status, `${what} in ${method} ${path} ${name}: ${res.text}`).toBe(validationStatus(path));
          expectProblem(res, validationStatus(path), { field: name });
          checked++;
        }
      }
    }
    // Runs, endpoints, batches and run actions: dozens of fields, three strings each.
    expect(checked).toBeGreaterThan(100);
  });

  it('in any query or path parameter are refused with a 4xx naming it, not a database error', async () => {
    for (const { method, path, op } of operations()) {
      for (const p of op.parameters ?? []) {
        if (p.in === 'header') continue;
        // The operation's other required query parameters are given, so that the one under test is the one at fault.
        const required = (op.parameters ?? [])
          .filter((q: { in: string; name: string; required?: boolean }) => q.in === 'query' && q.required && q.name !== p.name)
          .map((q: { name: string }) => `${q.name}=x`);
        const query = required.length ? `?${required.join('&')}` : '';
        const url = p.in === 'path' ? `${concrete(path, { [p.name]: 'a%00b' })}${query}` : `${concrete(path)}?${[...required, `${p.name}=a%00b`].join('&')}`;
        const res = await req(url, { method, ...(method === 'GET' || method === 'DELETE' ? {} : { json: {} }) });
        expectProblem(res, validationStatus(path), { field: p.name });
      }
    }
  });

  it('in the name of a multipart upload (RFC 5987 `filename*`) are refused naming filename', async () => {
    const boundary = 'edge-boundary';
    const body = [
      `--${boundary}`,
      'Content-Disposition: form-data; name="purpose"',
      '',
      'batch',
      `--${boundary}`,
      `Content-Disposition: form-data; name="file"; filename*=utf-8''a%00b.jsonl`,
      'Content-Type: application/jsonl',
      '',
      '{"prompt": "hi"}',
      `--${boundary}--`,
      '',
    ].join('\r\n');
    const res = await req('/v1/files', { method: 'POST', headers: { 'content-type': `multipart/form-data; boundary=${boundary}` }, body });
    expectProblem(res, 400, { field: 'filename' });
    expect((await req('/v1/files?purpose=batch')).body.data).toEqual([]);
  });

  it('stores nothing of a refused request: the runs list still reads as JSON everywhere', async () => {
    await req('/v1/runs', { method: 'POST', json: { model: 'm', metadata: { a: '\ud800' }, input: { requests: [{ prompt: 'x' }] } } });
    const list = await req('/v1/runs?limit=1000');
    expect(list.status).toBe(200);
    expect(/\\u[dD][89a-fA-F]|\\u0000/.test(list.text)).toBe(false);
  });
});

describe('input lines', () => {
  it('a line with such a string is invalid with its own code and line; batch error lines carry the custom_id of every line that had one', async () => {
    const line = (custom_id: string, content: string, extra: Record<string, unknown> = {}) =>
      JSON.stringify({
        custom_id,
        method: 'POST',
        url: '/v1/chat/completions',
        body: { model: 'no-such-model', messages: [{ role: 'user', content }] },
        ...extra,
      });
    const text = [
      line('fine', 'hello'),
      JSON.stringify({ custom_id: 'no-body', method: 'POST', url: '/v1/chat/completions' }),
      line('nul', 'a\u0000b'),
      line('lone', 'a\ud800b'),
      line('\udc00id', 'hello'),
      line('wrong-url', 'hello', { url: '/v1/embeddings' }),
    ].join('\n');
    const file = await req('/v1/files?purpose=batch&filename=edges.jsonl', { method: 'POST', headers: { 'content-type': 'application/jsonl' }, body: text });
    expect(file.status, file.text).toBe(201);
    const created = await req('/v1/batches', {
      method: 'POST',
      json: { input_file_id: file.body.id, endpoint: '/v1/chat/completions', completion_window: '24h' },
    });
    expect(created.status, created.text).toBe(200);
    const done = await waitFor('the batch to end', async () => {
      const b = (await req(`/v1/batches/${created.body.id}`)).body;
      return ['completed', 'failed', 'cancelled'].includes(b.status) ? b : undefined;
    });
    expect(done.errors.data.map((e: any) => [e.line, e.code])).toEqual([
      [1, 'model_not_found'],
      [2, 'invalid_request'],
      [3, 'invalid_characters'],
      [4, 'invalid_characters'],
      [5, 'invalid_characters'],
      [6, 'mismatched_endpoint'],
    ]);
    expect(done.errors.data[2].message).toContain('body.messages[0].content');
    const errorFile = await req(`/v1/files/${done.error_file_id}/content`);
    const lines = errorFile.text
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l));
    const byLine = new Map(lines.map((l) => [/^line (\d+)/.exec(l.error.message)?.[1] ?? l.custom_id, l]));
    expect(byLine.get('2')?.custom_id).toBe('no-body');
    expect(byLine.get('3')?.custom_id).toBe('nul');
    expect(byLine.get('4')?.custom_id).toBe('lone');
    // An id that is itself the fault is not repeated.
    expect(byLine.get('5')?.custom_id).toBeNull();
    expect(byLine.get('6')?.custom_id).toBe('wrong-url');
  });
});
