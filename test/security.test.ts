import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { peakRssMiB, startS3, type S3Server } from './support/faults.js';
import { call, spawnServer, startTestServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { makePrompts, waitForStatus } from './support/runner-checks.js';
import { onPg, openTestStore } from './support/store.js';

/** Everything the store holds for this data folder, as text: the SQLite file and its WAL, or every PostgreSQL table's rows. */
async function storedText(data: string): Promise<string> {
  if (!onPg) return readFileSync(join(data, 'regen.db')).toString('latin1') + readFileSync(join(data, 'regen.db-wal')).toString('latin1');
  const db = await openTestStore(data);
  try {
    const { rows: tables } = await db.exec<{ name: string }>(`select tablename as name from pg_tables where schemaname = 'public'`);
    let text = '';
    for (const { name } of tables) text += (await db.exec<{ t: string | null }>(`select string_agg(x::text, '') as t from "${name}" x`)).rows[0].t ?? '';
    return text;
  } finally {
    await db.close();
  }
}

// The security suite: bearer tokens on every /v1 route, secrets kept out of responses and logs,
// a corpus of hostile requests that must each be a 4xx problem (never a 500, a stack or a path),
// and hostile input files that must become per-line errors with memory staying bounded.

const sims: SimProcess[] = [];
const servers: ServerProcess[] = [];
const dirs: { cleanup(): void }[] = [];
const inProcess: { cleanup(): Promise<void> }[] = [];

afterAll(async () => {
  for (const s of servers) await s.kill('SIGKILL');
  for (const s of inProcess) await s.cleanup();
  await Promise.all(sims.map((s) => s.stop()));
  for (const d of dirs) d.cleanup();
});

function dir(prefix: string): string {
  const d = tempDir(prefix);
  dirs.push(d);
  return d.dir;
}

const auth = (token: string) => ({ authorization: `Bearer ${token}` });

/** A path of openapi.json with its parameters filled in by ids of the right shape that exist nowhere. */
function concrete(path: string): string {
  const prefix = /^\/v1\/(\w+?)s?\//.exec(path)?.[1] ?? 'x';
  const idPrefix = { run: 'run', endpoint: 'ep', file: 'file', batche: 'batch', batch: 'batch' }[prefix] ?? prefix;
  return path.replace('{id}', `${idPrefix}_0nosuchid000000000000000`).replace('{custom_id}', 'no-such-sample');
}

describe('bearer tokens', () => {
  const TOKENS = ['tok-alpha-0123456789', 'tok-beta-9876543210abcdef'];
  let base: string;
  let doc: any;

  beforeAll(async () => {
    const s = await startTestServer({ REGEN_API_TOKENS: TOKENS.join(',') });
    inProcess.push(s);
    base = s.url;
    doc = (await call(base, '/openapi.json')).body;
  });

  it('every /v1 operation in openapi.json and /metrics answer 401 problem+json without a valid token', async () => {
    const ops: [string, string][] = [];
    for (const [path, item] of Object.entries<any>(doc.paths)) {
      for (const method of Object.keys(item)) if (path.startsWith('/v1/') || path === '/metrics') ops.push([method.toUpperCase(), path]);
    }
    // Every resource of the API is in the list, so a new route cannot slip by unchecked.
    expect(ops.length).toBeGreaterThanOrEqual(20);
    const wrong: Record<string, string>[] = [
      {},
      { authorization: 'Bearer' },
      { authorization: 'Bearer ' },
      { authorization: 'Bearer tok-gamma' },
      // A prefix, an extension and another scheme of a real token are no token.
      { authorization: `Bearer ${TOKENS[0].slice(0, -1)}` },
      { authorization: `Bearer ${TOKENS[0]}x` },
      { authorization: `Basic ${Buffer.from(`user:${TOKENS[0]}`).toString('base64')}` },
      { authorization: TOKENS[0] },
      { 'x-api-key': TOKENS[0] },
    ];
    for (const [method, path] of ops) {
      const url = concrete(path);
      for (const headers of wrong) {
        const body = method === 'GET' || method === 'DELETE' ? undefined : '{}';
        const res = await call(base, url, { method, headers: { ...headers, 'content-type': 'application/json' }, body });
        expect(res.status, `${method} ${url} with ${JSON.stringify(headers)}`).toBe(401);
        expect(res.headers.get('content-type')).toContain('application/problem+json');
        expect(res.body.code).toBe('unauthorized');
      }
      // Either token works; what happens next is the route's business (404 for these ids, 422 for {}), never 401.
      for (const token of TOKENS) {
        const body = method === 'GET' || method === 'DELETE' ? undefined : '{}';
        const res = await call(base, url, { method, headers: { ...auth(token), 'content-type': 'application/json' }, body });
        expect(res.status, `${method} ${url} with a valid token`).not.toBe(401);
        expect(res.status, `${method} ${url} with a valid token`).toBeLessThan(500);
      }
    }
    expect((await call(base, '/metrics', { headers: auth(TOKENS[1]) })).status).toBe(200);
  });

  it('a path not in the document under /v1 needs the token too, and the public pages need none', async () => {
    expect((await call(base, '/v1/nothing-here')).status).toBe(401);
    expect((await call(base, '/v1/nothing-here', { headers: auth(TOKENS[0]) })).status).toBe(404);
    for (const path of ['/', '/healthz', '/readyz', '/docs', '/openapi.json', '/dashboard/app.js']) {
      const res = await call(base, path);
      expect(res.status, path).toBe(200);
    }
  });

  it('compares tokens in constant time: digests of equal length, every token checked', () => {
    // Timing cannot be measured reliably on a shared machine; the code is checked instead: the
    // given token and each configured one are hashed to 32 bytes and compared with
    // timingSafeEqual, and the loop visits every token whether or not one matched.
    const src = readFileSync(fileURLToPath(new URL('../src/http/auth.ts', import.meta.url)), 'utf8');
    const check = src.slice(src.indexOf('export function requireToken'));
    expect(src).toMatch(/createHash\('sha256'\)/);
    expect(check).toMatch(/const given = digest\(/);
    expect(check).toMatch(/timingSafeEqual\(d, given\) \|\| ok/);
    expect(check).not.toMatch(/===\s*given|given\s*===|\.includes\(|\.some\(/);
  });
});

describe('secrets', () => {
  const API_KEY = 'sk-test-SECRET-5a1d9f0c2e7b4a68';
  const AWS_SECRET = 'aws-SECRET-Qm9vYmFyYmF6cXV4MTIzNDU2';
  const TOKEN = 'tok-SECRET-7f3e2d1c0b9a8877';
  const BUCKET = 'regen-secrets';
  let s3: S3Server;
  let server: ServerProcess;

  afterAll(async () => {
    await s3?.stop();
  });

  it('appear in no response, no log line and not in the database; Authorization headers are not logged', async () => {
    s3 = await startS3(dir('regen-s3rver-secrets-'), BUCKET, 0, { anySecret: true });
    const data = dir('regen-secrets-');
    server = await spawnServer(data, {
      AWS_ACCESS_KEY_ID: 'S3RVER',
      AWS_SECRET_ACCESS_KEY: AWS_SECRET,
      AWS_REGION: 'us-east-1',
      REGEN_S3_ENDPOINT: s3.url,
      REGEN_S3_FORCE_PATH_STYLE: 'true',
      REGEN_OUTPUT_URI: `s3://${BUCKET}/regen/`,
      REGEN_API_TOKENS: TOKEN,
      // Everything the server can log, it logs.
      REGEN_LOG_LEVEL: 'trace',
    });
    servers.push(server);
    const sim = await spawnSimulator({ model: 'm-secret', 'max-running': 8 });
    sims.push(sim);
    const seen: string[] = [];
    const api = async (path: string, init: RequestInit & { json?: unknown } = {}) => {
      const res = await call(server.url, path, { ...init, headers: { ...auth(TOKEN), ...(init.headers ?? {}) } });
      // What came back only: the request's own path may carry a secret the test put there.
      seen.push(`${res.status} ${JSON.stringify([...res.headers])} ${typeof res.body === 'string' ? res.body : JSON.stringify(res.body)}`);
      return res;
    };

    const ep = await api('/v1/endpoints', { method: 'POST', json: { url: sim.url, api_key: API_KEY, name: 'secret-node' } });
    expect(ep.status).toBe(201);
    expect(ep.body.has_api_key).toBe(true);
    await waitFor('endpoint ready', async () => ((await api(`/v1/endpoints/${ep.body.id}`)).body.state === 'ready' ? true : undefined));
    const prompts = makePrompts(60, 'sec');
    const up = await api('/v1/files?filename=p.jsonl', { method: 'POST', body: prompts.jsonl, headers: { 'content-type': 'application/jsonl' } });
    expect(up.status).toBe(201);
    const run = await api('/v1/runs', { method: 'POST', json: { model: 'm-secret', input: { file_id: up.body.id }, shard_size: 25, metadata: { team: 'x' } } });
    expect(run.status).toBe(201);
    const done = await waitFor(
      'the run to finish',
      async () => {
        const r = await api(`/v1/runs/${run.body.id}`);
        return ['completed', 'failed'].includes(r.body.status) ? r : undefined;
      },
      60_000,
      250,
    );
    expect(done.body.status).toBe('completed');

    // Everything a user or a dashboard reads.
    for (const path of [
      '/v1/runs',
      `/v1/runs/${run.body.id}/samples?limit=100`,
      `/v1/runs/${run.body.id}/samples/sec-1`,
      `/v1/runs/${run.body.id}/shards`,
      `/v1/runs/${run.body.id}/quality`,
      `/v1/runs/${run.body.id}/events`,
      '/v1/endpoints',
      `/v1/endpoints/${ep.body.id}`,
      '/v1/files',
      `/v1/files/${up.body.id}`,
      '/metrics',
      '/readyz',
      '/healthz',
      '/openapi.json',
      '/docs',
      '/',
      '/v1/runs/run_nope',
      '/v1/endpoints/ep_nope',
    ]) {
      const res = await api(path);
      expect(res.status, path).toBeLessThan(500);
    }
    // Errors too: a refused token, a failed probe of an endpoint with a key, a bad body.
    seen.push(JSON.stringify((await call(server.url, '/v1/runs', { headers: auth('tok-wrong') })).body));
    const dead = await api('/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:9', api_key: API_KEY } });
    await waitFor('the probe to fail', async () => ((await api(`/v1/endpoints/${dead.body.id}`)).body.last_error ? true : undefined));
    await api('/v1/endpoints', { method: 'POST', json: { url: sim.url, api_key: 42 } });
    await api(`/v1/endpoints/${ep.body.id}`, { method: 'PATCH', json: { api_key: `${API_KEY}-rotated`, name: 'rotated' } });
    // A request whose Authorization header, query and body carry the secrets, as a careless client might send them.
    await api(`/v1/runs?after=${TOKEN}`, { headers: { 'x-api-key': API_KEY } });
    await call(server.url, '/v1/runs', { headers: { authorization: `Bearer ${API_KEY}` } });

    const log = server.output();
    for (const secret of [API_KEY, AWS_SECRET, TOKEN]) {
      for (const text of seen) expect(text.includes(secret), `a response contains ${secret}: ${text.slice(0, 200)}`).toBe(false);
      expect(log.includes(secret), `the log contains ${secret}`).toBe(false);
    }
    // The log did record the requests (at trace level), just not their credentials.
    expect(log).toContain('"msg":"request"');
    // S3 credentials and API tokens are never stored; only the endpoint's own key is, to be used.
    const db = await storedText(data);
    expect(db.includes(AWS_SECRET)).toBe(false);
    expect(db.includes(TOKEN)).toBe(false);
  });

  it('the OpenAPI document shows no credential in its examples', async () => {
    const text = JSON.stringify((await call(server.url, '/openapi.json')).body);
    expect(text).not.toMatch(/sk-[A-Za-z0-9]{8,}|AKIA[0-9A-Z]{16}|SECRET|Bearer [A-Za-z0-9]/);
    const examples: unknown[] = [];
    JSON.parse(text, (k, v) => {
      if (k === 'example' || k === 'examples') examples.push(v);
      return v;
    });
    for (const e of examples) expect(JSON.stringify(e)).not.toMatch(/"api_key"|"token"|bearer|secret|password/i);
  });
});

interface Hostile {
  name: string;
  method?: string;
  path: string;
  headers?: Record<string, string>;
  body?: string;
  json?: unknown;
  /** What the problem must name: its field, or words of its detail. */
  field?: string;
  detail?: RegExp;
  status?: number;
}

describe('hostile requests', () => {
  let server: ServerProcess;
  let data: string;
  const ids: Record<string, string> = {};

  beforeAll(async () => {
    data = dir('regen-hostile-');
    server = await spawnServer(data);
    servers.push(server);
    ids.ep = (await call(server.url, '/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:9' } })).body.id;
    const up = await call(server.url, '/v1/files', { method: 'POST', body: '{"prompt":"hi"}\n', headers: { 'content-type': 'application/jsonl' } });
    ids.file = up.body.id;
    ids.run = (await call(server.url, '/v1/runs', { method: 'POST', json: { model: 'm', input: { file_id: ids.file } } })).body.id;
  });

  const run = (extra: Record<string, unknown>) => ({ model: 'm', input: { file_id: ids.file }, ...extra });
  const deep = (n: number) => '['.repeat(n) + ']'.repeat(n);

  const cases = (): Hostile[] => [
    {
      name: 'malformed JSON',
      method: 'POST',
      path: '/v1/runs',
      body: '{"model": "m", "input": ',
      headers: { 'content-type': 'application/json' },
      status: 400,
      detail: /not valid JSON/,
    },
    { name: 'JSON that is not an object', method: 'POST', path: '/v1/runs', body: '[1,2,3]', headers: { 'content-type': 'application/json' }, status: 422 },
    { name: 'a body that is not JSON', method: 'POST', path: '/v1/runs', body: 'model=m', headers: { 'content-type': 'application/x-www-form-urlencoded' } },
    { name: 'model of the wrong type', method: 'POST', path: '/v1/runs', json: run({ model: 42 }), field: 'model' },
    { name: 'input of the wrong type', method: 'POST', path: '/v1/runs', json: run({ input: 'file_x' }), field: 'input' },
    { name: 'temperature -3', method: 'POST', path: '/v1/runs', json: run({ params: { temperature: -3 } }), field: 'params.temperature' },
    { name: 'temperature as a string', method: 'POST', path: '/v1/runs', json: run({ params: { temperature: 'hot' } }), field: 'params.temperature' },
    {
      name: 'temperature 1e999 (Infinity)',
      method: 'POST',
      path: '/v1/runs',
      body: JSON.stringify(run({})).replace(/}$/, ',"params":{"temperature":1e999}}'),
      headers: { 'content-type': 'application/json' },
      field: 'params.temperature',
    },
    { name: 'shard_size 0', method: 'POST', path: '/v1/runs', json: run({ shard_size: 0 }), field: 'shard_size' },
    { name: 'shard_size 1e12', method: 'POST', path: '/v1/runs', json: run({ shard_size: 1e12 }), field: 'shard_size' },
    { name: 'shard_size 2.5', method: 'POST', path: '/v1/runs', json: run({ shard_size: 2.5 }), field: 'shard_size' },
    { name: 'max_attempts -1', method: 'POST', path: '/v1/runs', json: run({ max_attempts: -1 }), field: 'max_attempts' },
    { name: 'request_timeout_ms 1e15', method: 'POST', path: '/v1/runs', json: run({ request_timeout_ms: 1e15 }), field: 'request_timeout_ms' },
    { name: 'priority as a string', method: 'POST', path: '/v1/runs', json: run({ priority: '1' }), field: 'priority' },
    { name: 'an empty model name', method: 'POST', path: '/v1/runs', json: run({ model: '' }), field: 'model' },
    { name: 'a 100 KB model name', method: 'POST', path: '/v1/runs', json: run({ model: 'm'.repeat(100_000) }), field: 'model' },
    { name: 'params with model inside', method: 'POST', path: '/v1/runs', json: run({ params: { model: 'other' } }), field: 'params' },
    { name: 'an unknown top-level key', method: 'POST', path: '/v1/runs', json: run({ endpoint_url: 'http://169.254.169.254/' }), field: 'endpoint_url' },
    {
      name: '__proto__ as a key',
      method: 'POST',
      path: '/v1/runs',
      body: JSON.stringify(run({})).replace(/}$/, ',"__proto__":{"admin":true}}'),
      headers: { 'content-type': 'application/json' },
      field: '__proto__',
    },
    {
      name: 'params nested 5,000 deep',
      method: 'POST',
      path: '/v1/runs',
      body: JSON.stringify(run({})).replace(/}$/, `,"params":{"x":${deep(5000)}}}`),
      headers: { 'content-type': 'application/json' },
      field: 'params',
    },
    {
      name: 'metadata nested 100,000 deep',
      method: 'POST',
      path: '/v1/runs',
      body: JSON.stringify(run({})).replace(/}$/, `,"metadata":{"x":${deep(100_000)}}}`),
      headers: { 'content-type': 'application/json' },
      field: 'metadata.x',
    },
    {
      name: 'inline request content nested 5,000 deep',
      method: 'POST',
      path: '/v1/runs',
      body: `{"model":"m","input":{"requests":[{"messages":[{"role":"user","content":${deep(5000)}}]}]}}`,
      headers: { 'content-type': 'application/json' },
    },
    {
      name: 'a 20 MB JSON body',
      method: 'POST',
      path: '/v1/runs',
      body: JSON.stringify(run({ name: 'x'.repeat(20 << 20) })),
      headers: { 'content-type': 'application/json' },
      status: 413,
    },
    { name: 'limit -5', path: '/v1/runs?limit=-5', field: 'limit' },
    { name: 'limit abc', path: '/v1/runs?limit=abc', field: 'limit' },
    { name: 'limit 1e12', path: '/v1/endpoints?limit=1e12', field: 'limit' },
    { name: 'shard cursor -1', path: `/v1/runs/${ids.run}/shards?after=-1`, field: 'after' },
    { name: 'an unknown run', path: '/v1/runs/run_0doesnotexist00000000000', status: 404, detail: /run .* does not exist/ },
    { name: 'an unknown endpoint', method: 'DELETE', path: '/v1/endpoints/ep_0doesnotexist00000000000', status: 404 },
    { name: 'an unknown file', path: '/v1/files/file_0doesnotexist0000000000/content', status: 404 },
    { name: 'an unknown sample', path: `/v1/runs/${ids.run}/samples/nope`, status: 404 },
    { name: 'a run id of 5,000 characters', path: `/v1/runs/run_${'a'.repeat(5000)}`, field: 'id' },
    { name: 'path traversal in a run id', path: '/v1/runs/..%2F..%2Fetc%2Fpasswd' },
    { name: 'path traversal in a file id', path: '/v1/files/..%2F..%2Fregen.db/content' },
    { name: 'path traversal in a custom_id', path: `/v1/runs/${ids.run}/samples/..%2F..%2F..%2Fetc%2Fpasswd`, status: 404 },
    { name: 'path traversal to the dashboard', path: '/dashboard/..%2F..%2Fserver.ts', status: 404 },
    { name: 'a bad percent-encoding in an id', path: '/v1/runs/%E0%A4%A' },
    { name: 'a lone % in an id', path: '/v1/runs/%ZZ' },
    { name: 'file:///etc/passwd as input', method: 'POST', path: '/v1/runs', json: { model: 'm', input: { uri: 'file:///etc/passwd' } }, field: 'input.uri' },
    {
      name: 'a file:// input climbing out of the data folder',
      method: 'POST',
      path: '/v1/runs',
      json: { model: 'm', input: { uri: `file://${data}/../../etc/passwd` } },
      field: 'input.uri',
    },
    { name: 'a file://host/ input', method: 'POST', path: '/v1/runs', json: { model: 'm', input: { uri: 'file://localhost/etc/passwd' } }, field: 'input.uri' },
    {
      name: 'the metadata service as input',
      method: 'POST',
      path: '/v1/runs',
      json: { model: 'm', input: { uri: 'http://169.254.169.254/latest/meta-data/' } },
      field: 'input.uri',
    },
    { name: 'an s3 input with ..', method: 'POST', path: '/v1/runs', json: { model: 'm', input: { uri: 's3://bucket/a/../../b.jsonl' } }, field: 'input.uri' },
    { name: 'an s3 output with ..', method: 'POST', path: '/v1/runs', json: run({ output: { uri: 's3://bucket/a/../b/' } }), field: 'output.uri' },
    {
      name: 'a file output with ..',
      method: 'POST',
      path: '/v1/runs',
      json: run({ output: { uri: `file://${data}/objects/../../../tmp/` } }),
      field: 'output.uri',
    },
    { name: 'a file output outside the roots', method: 'POST', path: '/v1/runs', json: run({ output: { uri: 'file:///etc/' } }), field: 'output.uri' },
    {
      name: 'an input file_id with traversal',
      method: 'POST',
      path: '/v1/runs',
      json: { model: 'm', input: { file_id: '../../regen.db' } },
      field: 'input.file_id',
    },
    { name: 'an unknown endpoint state', method: 'PATCH', path: `/v1/endpoints/${ids.ep}`, json: { state: 'exploded' }, field: 'state' },
    { name: 'an endpoint state that only probes may set', method: 'PATCH', path: `/v1/endpoints/${ids.ep}`, json: { state: 'unhealthy' }, field: 'state' },
    { name: 'an endpoint URL that is not http', method: 'POST', path: '/v1/endpoints', json: { url: 'file:///etc/passwd' }, field: 'url' },
    { name: 'an endpoint URL with credentials', method: 'POST', path: '/v1/endpoints', json: { url: 'http://user:pass@10.0.0.5:30000' }, field: 'url' },
    { name: 'the metadata service as an endpoint', method: 'POST', path: '/v1/endpoints', json: { url: 'http://169.254.169.254/latest' }, field: 'url' },
    { name: 'the metadata service as a decimal address', method: 'POST', path: '/v1/endpoints', json: { url: 'http://2852039166/' }, field: 'url' },
    {
      name: 'the metadata service as IPv4-mapped IPv6',
      method: 'POST',
      path: '/v1/endpoints',
      json: { url: 'http://[::ffff:169.254.169.254]/' },
      field: 'url',
    },
    { name: 'the metadata service by name', method: 'POST', path: '/v1/endpoints', json: { url: 'http://metadata.google.internal/' }, field: 'url' },
    { name: 'a javascript: endpoint URL', method: 'POST', path: '/v1/endpoints', json: { url: 'javascript:alert(1)' }, field: 'url' },
    { name: 'max_concurrency -1', method: 'POST', path: '/v1/endpoints', json: { url: 'http://10.0.0.9:1', max_concurrency: -1 }, field: 'max_concurrency' },
    { name: 'a NUL status filter', path: '/v1/runs?status=%00', field: 'status' },
    { name: 'a NUL sample filter', path: `/v1/runs/${ids.run}/samples?status=%00`, field: 'status' },
    { name: 'a NUL flag filter', path: `/v1/runs/${ids.run}/samples?flag=%00`, field: 'flag' },
    { name: 'a NUL purpose filter', path: '/v1/files?purpose=%00', field: 'purpose' },
    {
      name: 'a 10 KB Idempotency-Key',
      method: 'POST',
      path: '/v1/runs',
      json: run({}),
      headers: { 'idempotency-key': 'k'.repeat(10_000) },
      field: 'idempotency-key',
    },
    { name: 'a 10 KB Last-Event-ID', path: `/v1/runs/${ids.run}/events`, headers: { 'last-event-id': '9'.repeat(10_000) }, field: 'last-event-id' },
    { name: 'a 10 KB content-type', method: 'POST', path: '/v1/runs', body: '{}', headers: { 'content-type': `application/${'x'.repeat(10_000)}` } },
    { name: 'an upload of an unknown type', method: 'POST', path: '/v1/files', body: 'x', headers: { 'content-type': 'image/png' }, status: 415 },
    { name: 'a retry of something unknown', method: 'POST', path: `/v1/runs/${ids.run}/retry`, json: { only: 'everything' }, field: 'only' },
    { name: 'a method no route has', method: 'PUT', path: '/v1/runs', json: {}, status: 405, detail: /PUT is not allowed/ },
  ];

  it('answers each with a 4xx problem+json naming the problem, never a 5xx, a stack or a path', async () => {
    const results: string[] = [];
    const wrong: string[] = [];
    const root = fileURLToPath(new URL('..', import.meta.url));
    for (const c of cases()) {
      const headers = { ...(c.json !== undefined ? { 'content-type': 'application/json' } : {}), ...(c.headers ?? {}) };
      const res = await fetch(server.url + c.path, { method: c.method ?? 'GET', headers, body: c.json !== undefined ? JSON.stringify(c.json) : c.body });
      const text = await res.text();
      let body: any = null;
      try {
        body = JSON.parse(text);
      } catch {
        /* reported below */
      }
      results.push(`${res.status} ${c.name}: ${body?.detail ?? text.slice(0, 100)}`);
      const problems = [
        (res.status < 400 || res.status >= 500) && 'not a 4xx',
        c.status && res.status !== c.status && `not a ${c.status}`,
        !res.headers.get('content-type')?.includes('application/problem+json') && 'not problem+json',
        body?.status !== res.status && 'status field differs',
        !(typeof body?.detail === 'string' && body.detail.length > 0) && 'no detail',
        c.field && body?.field !== c.field && `field is ${body?.field}, not ${c.field}`,
        c.detail && !c.detail.test(body?.detail ?? '') && `detail does not match ${c.detail}`,
        /\bat .+[/\\]|\.ts:\d|\.js:\d|node_modules/.test(text) && 'a stack trace',
        (text.includes(data) || text.includes(root)) && 'a server path',
      ].filter(Boolean);
      if (problems.length) wrong.push(`${c.name}: ${problems.join(', ')} — ${res.status} ${text.slice(0, 200)}`);
    }
    expect(wrong).toEqual([]);
    // A header past Node's 16 KB limit is refused by the HTTP parser itself, and the server lives on.
    const huge = await fetch(server.url + '/v1/runs', { headers: { 'x-pad': 'p'.repeat(20_000) } });
    expect(huge.status).toBe(431);
    expect((await call(server.url, '/healthz')).status).toBe(200);
    expect(server.output()).not.toMatch(/unhandled error/);
    console.log(`security: ${results.length} hostile requests\n${results.join('\n')}`);
  });
});

describe('hostile input files', () => {
  let server: ServerProcess;

  beforeAll(async () => {
    server = await spawnServer(dir('regen-hostile-files-'));
    servers.push(server);
  });

  /** Streams `body` as an upload, as a client with a huge file would: never one string in this process. */
  async function upload(body: Readable | Buffer | string): Promise<string> {
    const res = await fetch(`${server.url}/v1/files?filename=hostile.jsonl`, {
      method: 'POST',
      headers: { 'content-type': 'application/jsonl' },
      body: (body instanceof Readable ? Readable.toWeb(body) : body) as BodyInit,
      duplex: 'half',
    } as RequestInit);
    const json = await res.json();
    expect(res.status, JSON.stringify(json)).toBe(201);
    return json.id;
  }

  async function validate(fileId: string, onInvalid: 'skip' | 'fail' = 'skip'): Promise<any> {
    const created = await call(server.url, '/v1/runs', {
      method: 'POST',
      json: { model: 'm-hostile', input: { file_id: fileId }, on_invalid_line: onInvalid },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    return waitForStatus(server.url, created.body.id, ['queued', 'failed'], 90_000);
  }

  const valid = (id: string) => JSON.stringify({ custom_id: id, messages: [{ role: 'user', content: `hello ${id}` }] });
  const errorsOf = (run: any) => run.invalid_lines.errors.map((e: any) => [e.line, e.message]);

  it('turns each into per-line errors with line numbers, and the server memory stays bounded', async () => {
    const pid = server.proc.pid!;
    const baseMiB = peakRssMiB(pid);
    const figures: Record<string, number> = {};

    // Bytes that are not UTF-8: inside a JSON string, and an overlong encoding of "/".
    const bytes = Buffer.concat([
      Buffer.from(valid('u1') + '\n'),
      Buffer.from('{"custom_id":"u2","messages":[{"role":"user","content":"caf'),
      Buffer.from([0xff, 0xfe]),
      Buffer.from('"}]}\n'),
      Buffer.from(valid('u3') + '\n'),
      Buffer.from('{"custom_id":"u4","prompt":"'),
      Buffer.from([0xc0, 0xaf]),
      Buffer.from('"}\n'),
    ]);
    const utf8 = await validate(await upload(bytes));
    expect(utf8.status).toBe('queued');
    expect(utf8.request_counts.total).toBe(2);
    expect(errorsOf(utf8)).toEqual([
      [2, 'not valid UTF-8'],
      [4, 'not valid UTF-8'],
    ]);

    // One 50 MB line, generated as it is sent, then a good line.
    const MB = Buffer.alloc(1 << 20, 'a');
    async function* huge() {
      yield Buffer.from('{"custom_id":"huge","messages":[{"role":"user","content":"');
      for (let i = 0; i < 50; i++) yield MB;
      yield Buffer.from(`"}]}\n${valid('after-huge')}\n`);
    }
    const big = await validate(await upload(Readable.from(huge())));
    expect(big.status).toBe('queued');
    expect(big.request_counts.total).toBe(1);
    expect(errorsOf(big)).toEqual([[1, 'line is longer than 16777216 bytes']]);
    figures.after_50mb_line = peakRssMiB(pid);

    // A million empty lines, then a broken line and a good one: the line numbers still add up.
    async function* empties() {
      const block = Buffer.alloc(100_000, '\n');
      for (let i = 0; i < 10; i++) yield block;
      yield Buffer.from(`not json\n${valid('after-empties')}\n`);
    }
    const emptyFile = await upload(Readable.from(empties()));
    const skipped = await validate(emptyFile);
    expect(skipped.request_counts.total).toBe(1);
    expect(errorsOf(skipped)).toEqual([[1_000_001, expect.stringMatching(/^not valid JSON/)]]);
    const failed = await validate(emptyFile, 'fail');
    expect(failed.status).toBe('failed');
    expect(failed.status_reason).toMatch(/^input has 1 invalid line\(s\); first: line 1000001: not valid JSON/);
    figures.after_1m_empty_lines = peakRssMiB(pid);

    // Nesting: deep content parses but could never be stored or sent; a million levels parse too.
    const deep = (n: number) => '['.repeat(n) + ']'.repeat(n);
    const nested =
      [
        `{"custom_id":"deep","messages":[{"role":"user","content":${deep(5000)}}]}`,
        `{"custom_id":"deeper","messages":${deep(1_000_000)}}`,
        valid('shallow'),
      ].join('\n') + '\n';
    const deepRun = await validate(await upload(nested));
    expect(deepRun.status).toBe('queued');
    expect(deepRun.request_counts.total).toBe(1);
    expect(errorsOf(deepRun)).toEqual([
      [1, 'line is nested more than 100 levels deep'],
      [2, 'line is nested more than 100 levels deep'],
    ]);

    // Duplicate ids: the first of each is kept, every repeat is named with its line.
    const dups = await validate(await upload([valid('a'), valid('b'), valid('a'), valid('c'), valid('b'), valid('a')].join('\n') + '\n'));
    expect(dups.request_counts.total).toBe(3);
    expect(dups.invalid_lines.errors).toEqual([
      { line: 3, message: 'duplicate custom_id "a"', custom_id: 'a' },
      { line: 5, message: 'duplicate custom_id "b"', custom_id: 'b' },
      { line: 6, message: 'duplicate custom_id "a"', custom_id: 'a' },
    ]);

    const peak = peakRssMiB(pid);
    console.log(
      'security files: peak RSS MiB',
      JSON.stringify({
        at_start: Math.round(baseMiB),
        ...Object.fromEntries(Object.entries(figures).map(([k, v]) => [k, Math.round(v)])),
        at_end: Math.round(peak),
      }),
    );
    // The 50 MB line is never held whole: at most the 16 MB line limit plus buffers.
    expect(peak - baseMiB).toBeLessThan(200);
    expect((await call(server.url, '/healthz')).status).toBe(200);
    expect(server.output()).not.toMatch(/unhandled error|ingest crashed/);
  });
});
