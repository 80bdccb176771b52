import { expectProblem as shared, request, type Raw } from './support/http.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadSource } from './support/build.js';
import { call, spawnServer, startTestServer, tempDir, waitFor } from './support/server.js';

// As the server under test has it (its deps are the compiled tree's, test/support/build.ts).
const { upsertEndpoint } = await loadSource<typeof import('../src/services/endpoints.js')>('src/services/endpoints.ts');

type TestServer = Awaited<ReturnType<typeof startTestServer>>;

// The runner is on (probes included) but nothing listens at the registered URLs, so endpoints
// never become ready and no run is dispatched.
let server: TestServer;
const SECRET = `sk-secret-${Math.random().toString(36).slice(2)}`;
const responses: string[] = [];

beforeAll(async () => {
  server = await startTestServer({ REGEN_PROBE_INTERVAL_MS: '200' });
});
afterAll(async () => {
  await server?.cleanup();
});

/** Every response's raw text is kept, to check afterwards that no api_key was ever in one. */
async function req(path: string, init: RequestInit & { json?: unknown } = {}): Promise<Raw> {
  const res = await request(server.url, path, init);
  responses.push(res.text);
  return res;
}

function expectProblem(res: Raw, status: number, code?: string, field?: string) {
  shared(res, status, { code, field, hidden: [server.config.dataDir] });
}

// Ports nothing listens on: loopback port 1 and 9 refuse connections at once.
const URL_A = 'http://127.0.0.1:1';
const URL_B = 'http://127.0.0.1:9';

describe('registering endpoints', () => {
  it('registers (201), then the same url again is an upsert (200, same id)', async () => {
    const first = await req('/v1/endpoints', { method: 'POST', json: { url: URL_A, name: 'node-a', max_concurrency: 8, api_key: SECRET } });
    expect(first.status, first.text).toBe(201);
    expect(first.body).toMatchObject({
      object: 'endpoint',
      url: URL_A,
      name: 'node-a',
      max_concurrency: 8,
      has_api_key: true,
      in_flight: 0,
      weight: 1,
    });
    expect(first.body.id).toMatch(/^ep_/);
    expect(['starting', 'unhealthy']).toContain(first.body.state);
    expect(first.body).not.toHaveProperty('api_key');

    const again = await req('/v1/endpoints', { method: 'POST', json: { url: URL_A } });
    expect(again.status, again.text).toBe(200);
    expect(again.body.id).toBe(first.body.id);
    // Fields not sent are kept, including the key.
    expect(again.body).toMatchObject({ name: 'node-a', max_concurrency: 8, has_api_key: true });

    for (const variant of [`${URL_A}/`, `${URL_A}/v1`, `${URL_A}/v1/`, `${URL_A}/v1/?x=1#frag`]) {
      const res = await req('/v1/endpoints', { method: 'POST', json: { url: variant } });
      expect(res.status, variant).toBe(200);
      expect(res.body.id).toBe(first.body.id);
      expect(res.body.url).toBe(URL_A);
    }
    const list = await req('/v1/endpoints');
    expect(list.body.data.filter((e: any) => e.url === URL_A)).toHaveLength(1);
  });

  it('registrations of one URL at once make one endpoint: one is created, the rest update it', async () => {
    // Called side by side in one process, each looks the URL up before any has inserted it: over
    // HTTP the requests' parsing spaces them out too much to meet.
    const url = 'http://127.0.0.1:7';
    const all = await Promise.all(Array.from({ length: 20 }, (_, i) => upsertEndpoint(server.deps, { url, name: `racer-${i}` })));
    expect(all.filter((r) => r.created)).toHaveLength(1);
    expect(new Set(all.map((r) => r.endpoint.id)).size).toBe(1);
    const listed = (await req('/v1/endpoints?limit=100')).body.data.filter((e: { url: string }) => e.url === url);
    expect(listed).toHaveLength(1);
    expect((await req(`/v1/endpoints/${listed[0].id}`, { method: 'DELETE' })).status).toBe(200);
  });

  it('an upsert updates what it is given', async () => {
    const res = await req('/v1/endpoints', { method: 'POST', json: { url: `${URL_A}/v1/`, name: 'renamed', weight: 2.5, labels: { gpu: 'h100' } } });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ name: 'renamed', weight: 2.5, labels: { gpu: 'h100' }, max_concurrency: 8 });
  });

  it('rejects bad registrations with 422 naming the field', async () => {
    const cases: [unknown, string][] = [
      [{ url: 'ftp://h:1' }, 'url'],
      [{ url: 'not a url' }, 'url'],
      [{ url: 'http://user:pw@h:1' }, 'url'],
      [{ url: 'http://169.254.169.254/' }, 'url'],
      [{ url: 'http://[::ffff:169.254.169.254]/' }, 'url'],
      [{ url: 'http://[fe80::1]:30000/' }, 'url'],
      [{ url: 'http://metadata.google.internal/' }, 'url'],
      [{ url: 'http://metadata.google.internal./' }, 'url'],
      [{ url: 'http://[::169.254.169.254]/' }, 'url'],
      [{ url: 'http://[fd00:ec2::254]/' }, 'url'],
      [{ url: 'http://100.100.100.200/latest/meta-data/' }, 'url'],
      [{ url: URL_B, max_concurrency: 0 }, 'max_concurrency'],
      [{ url: URL_B, weight: 0 }, 'weight'],
      [{ url: URL_B, api_key: '' }, 'api_key'],
      [{ url: URL_B, token: 'x' }, 'token'],
      [{ url: URL_B, request_priority: 1.5 }, 'request_priority'],
      [{ url: URL_B, bulk_header: 'yes' }, 'bulk_header'],
      [{ url: URL_B, share: { reserve_slots: -1, max_other_queue: 0 } }, 'share.reserve_slots'],
      [{ url: URL_B, timezone: 'Mars/Olympus' }, 'timezone'],
      [{ url: URL_B, schedule: [{ from: '25:00', to: '07:00' }] }, 'schedule[0].from'],
      [{ url: URL_B, schedule: [{ from: '08:00', to: '08:00' }] }, 'schedule[0].to'],
      [{ url: URL_B, schedule: [{ days: ['someday'], from: '08:00', to: '09:00' }] }, 'schedule[0].days[0]'],
      [{ url: URL_B, schedule: [] }, 'schedule'],
      [{ url: URL_B, lend_until: 'tomorrow' }, 'lend_until'],
      [{ url: URL_B, drain_grace_ms: -5 }, 'drain_grace_ms'],
      [{}, 'url'],
    ];
    for (const [json, field] of cases) {
      const res = await req('/v1/endpoints', { method: 'POST', json });
      expectProblem(res, 422, 'validation_failed', field);
      expect(res.text).not.toContain('user:pw');
    }
    expectProblem(await req('/v1/endpoints', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"url"' }), 400, 'invalid_request');
  });
});

describe('reading, changing and removing endpoints', () => {
  it('lists, gets and pages', async () => {
    const b = await req('/v1/endpoints', { method: 'POST', json: { url: URL_B, api_key: `${SECRET}-b` } });
    expect(b.status).toBe(201);
    expect(b.body.name).toBe('127.0.0.1:9');
    const extra: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await req('/v1/endpoints', { method: 'POST', json: { url: `http://127.0.0.2:${1000 + i}` } });
      expect(res.status).toBe(201);
      extra.push(res.body.id);
    }

    const all = await req('/v1/endpoints');
    expect(all.status).toBe(200);
    expect(all.body.object).toBe('list');
    expect(all.body.has_more).toBe(false);
    const ids = all.body.data.map((e: any) => e.id);
    expect(ids).toEqual(expect.arrayContaining([b.body.id, ...extra]));

    const seen: string[] = [];
    let after: string | null = null;
    for (let pages = 0; ; pages++) {
      expect(pages).toBeLessThan(20);
      const res: Raw = await req(`/v1/endpoints?limit=2${after ? `&after=${after}` : ''}`);
      expect(res.body.data.length).toBeLessThanOrEqual(2);
      expect(res.body.last_id).toBe(res.body.data.at(-1)?.id ?? null);
      seen.push(...res.body.data.map((e: any) => e.id));
      if (!res.body.has_more) break;
      after = res.body.last_id;
    }
    expect(seen).toEqual(ids);

    const one = await req(`/v1/endpoints/${b.body.id}`);
    expect(one.status).toBe(200);
    expect(one.body).toMatchObject({ id: b.body.id, url: URL_B, has_api_key: true });
    expect(one.body.stats).toMatchObject({ completed: 0, failed: 0 });
    expect(one.body.server).toEqual(expect.objectContaining({ running: null }));
  });

  it('patches name, max_concurrency, weight and state', async () => {
    const ep = (await req('/v1/endpoints', { method: 'POST', json: { url: URL_B } })).body;
    const named = await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { name: 'node-b', max_concurrency: 3, weight: 0.5 } });
    expect(named.status, named.text).toBe(200);
    expect(named.body).toMatchObject({ name: 'node-b', max_concurrency: 3, max_concurrency_source: 'user', weight: 0.5 });

    const draining = await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { state: 'draining' } });
    expect(draining.body.state).toBe('draining');
    // Re-registering does not undo an operator's decision.
    expect((await req('/v1/endpoints', { method: 'POST', json: { url: URL_B } })).body.state).toBe('draining');

    const disabled = await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { state: 'disabled' } });
    expect(disabled.body.state).toBe('disabled');
    // The prober leaves a disabled endpoint alone.
    await new Promise((r) => setTimeout(r, 600));
    expect((await req(`/v1/endpoints/${ep.id}`)).body.state).toBe('disabled');

    // `ready` asks for a probe; with nothing listening the endpoint cannot actually be ready.
    const ready = await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { state: 'ready' } });
    expect(ready.status).toBe(200);
    expect(['starting', 'unhealthy']).toContain(ready.body.state);

    const unset = await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { max_concurrency: null } });
    expect(unset.body.max_concurrency_source).not.toBe('user');
    expect(unset.body.name).toBe('node-b');

    expectProblem(await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { state: 'healthy' } }), 422, 'validation_failed', 'state');
    expectProblem(await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { state: 'unhealthy' } }), 422, 'validation_failed', 'state');
    expectProblem(await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { max_concurrency: -1 } }), 422, 'validation_failed', 'max_concurrency');
    expectProblem(await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { url: 'http://elsewhere:1' } }), 422, 'validation_failed', 'url');
    expectProblem(await req('/v1/endpoints/ep_nope', { method: 'PATCH', json: { name: 'x' } }), 404, 'not_found');
  });

  it('patches the sharing settings: a schedule in its zone, a lend, the priority and the bulk header, and clears them with null', async () => {
    const ep = (await req('/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:9/share' } })).body;
    expect(ep).toMatchObject({
      request_priority: null,
      bulk_header: false,
      share: null,
      schedule: null,
      timezone: 'UTC',
      lend_until: null,
      off_schedule: false,
    });
    const schedule = [{ days: ['sat', 'sun'], from: '22:00', to: '06:00' }];
    const set = await req(`/v1/endpoints/${ep.id}`, {
      method: 'PATCH',
      json: { request_priority: -1, bulk_header: true, schedule, timezone: 'Europe/Paris', lend_until: '2026-01-01T00:00:00+01:00', drain_grace_ms: 30_000 },
    });
    expect(set.status, set.text).toBe(200);
    // The lend is over already: off schedule, with no window to come.
    expect(set.body).toMatchObject({
      request_priority: -1,
      bulk_header: true,
      schedule,
      timezone: 'Europe/Paris',
      lend_until: '2025-12-31T23:00:00.000Z',
      drain_grace_ms: 30_000,
      off_schedule: true,
      next_window_at: null,
    });
    const cleared = await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { schedule: null, lend_until: null, request_priority: null } });
    expect(cleared.body).toMatchObject({
      schedule: null,
      lend_until: null,
      request_priority: null,
      off_schedule: false,
      next_window_at: null,
      timezone: 'Europe/Paris',
    });
  });

  it('deletes: afterwards get, patch and delete are 404', async () => {
    const ep = (await req('/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.3:7' } })).body;
    const del = await req(`/v1/endpoints/${ep.id}`, { method: 'DELETE' });
    expect(del.status).toBe(200);
    expect(del.body).toEqual({ id: ep.id, object: 'endpoint', deleted: true });
    expectProblem(await req(`/v1/endpoints/${ep.id}`), 404, 'not_found');
    expectProblem(await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { name: 'x' } }), 404, 'not_found');
    expectProblem(await req(`/v1/endpoints/${ep.id}`, { method: 'DELETE' }), 404, 'not_found');
    expect((await req('/v1/endpoints')).body.data.map((e: any) => e.id)).not.toContain(ep.id);
    // The url can be registered again, as a new endpoint.
    const back = await req('/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.3:7' } });
    expect(back.status).toBe(201);
    expect(back.body.id).not.toBe(ep.id);
  });

  it('answers 422 for a malformed id', async () => {
    expectProblem(await req('/v1/endpoints/ep%20x'), 422, 'validation_failed', 'id');
  });
});

describe('the api_key', () => {
  it('is write-only: patching it keeps has_api_key right, and clearing it with null works', async () => {
    const ep = (await req('/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.4:5' } })).body;
    expect(ep.has_api_key).toBe(false);
    const set = await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { api_key: `${SECRET}-patched` } });
    expect(set.body.has_api_key).toBe(true);
    const cleared = await req(`/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { api_key: null } });
    expect(cleared.body.has_api_key).toBe(false);
  });

  it('a failed probe of an endpoint with a key reports no key in last_error', async () => {
    const ep = (await req('/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:2', api_key: SECRET } })).body;
    const got = await waitFor('the probe to fail', async () => {
      const r = await req(`/v1/endpoints/${ep.id}`);
      return r.body.last_error ? r : undefined;
    });
    expect(got.body.last_error).toBe('connection refused');
    expect(got.text).not.toContain(SECRET);
  });

  it('never appears in any response this file received', async () => {
    const seenAll = await req('/v1/endpoints?limit=1000');
    expect(seenAll.body.data.some((e: any) => e.has_api_key)).toBe(true);
    for (const e of seenAll.body.data) {
      expect(Object.keys(e)).not.toContain('api_key');
      await req(`/v1/endpoints/${e.id}`);
    }
    await req('/openapi.json');
    await req('/metrics');
    expect(responses.length).toBeGreaterThan(20);
    for (const text of responses) expect(text).not.toContain('sk-secret-');
  });
});

describe('the api_key in logs', () => {
  it('is never written to the server log, at any level', async () => {
    const dir = tempDir('regen-endpoint-log-');
    const proc = await spawnServer(dir.dir, { REGEN_LOG_LEVEL: 'trace', REGEN_PROBE_INTERVAL_MS: '100' });
    try {
      const ep = await call(proc.url, '/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:3', api_key: SECRET } });
      expect(ep.status).toBe(201);
      await call(proc.url, `/v1/endpoints/${ep.body.id}`, { method: 'PATCH', json: { api_key: `${SECRET}-2`, state: 'ready' } });
      await call(proc.url, '/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:3/v1', api_key: `${SECRET}-3` } });
      // Let the prober fail against the closed port a few times, so its errors are logged too.
      await waitFor('a failed probe', async () => ((await call(proc.url, `/v1/endpoints/${ep.body.id}`)).body.last_error ? true : undefined), 20_000);
      await proc.kill('SIGTERM');
      expect(proc.output()).toContain('endpoint');
      expect(proc.output()).not.toContain('sk-secret-');
    } finally {
      await proc.kill('SIGKILL');
      dir.cleanup();
    }
  });
});
