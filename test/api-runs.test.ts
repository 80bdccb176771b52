import { expectProblem as shared, request, type Raw } from './support/http.js';
import { mkdirSync, realpathSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventsAfter } from '../src/db/events.js';
import { transitionRun } from '../src/db/runs.js';
import type { Db } from '../src/db/types.js';
import { cancelRun } from '../src/services/runs/actions.js';
import { startTestServer, tempDir, waitFor } from './support/server.js';

type TestServer = Awaited<ReturnType<typeof startTestServer>>;

// `api` validates and queues runs without dispatch; `live` has a runner (and no endpoints), so
// lifecycle changes are acted on the way they are in production.
let api: TestServer;
let live: TestServer;
const outside = tempDir('regen-outside-');

beforeAll(async () => {
  [api, live] = await Promise.all([
    startTestServer({ REGEN_RUNNER: 'false', REGEN_S3_ENDPOINT: 'http://127.0.0.1:9', REGEN_S3_FORCE_PATH_STYLE: 'true' }),
    startTestServer({ REGEN_PROBE_INTERVAL_MS: '200' }),
  ]);
});
afterAll(async () => {
  await Promise.all([api?.cleanup(), live?.cleanup()]);
  outside.cleanup();
});

const req = (server: TestServer, path: string, init: Parameters<typeof request>[2] = {}) => request(server.url, path, init);

function expectProblem(res: Raw, status: number, code?: string, field?: string) {
  shared(res, status, { code, field, hidden: [api, live].map((srv) => srv.config.dataDir) });
}

async function upload(server: TestServer, text: string, filename = 'input.jsonl'): Promise<string> {
  const res = await req(server, `/v1/files?filename=${filename}`, { method: 'POST', headers: { 'content-type': 'application/jsonl' }, body: text });
  expect(res.status, res.text).toBe(201);
  return res.body.id;
}

async function create(server: TestServer, body: Record<string, unknown>, headers: Record<string, string> = {}): Promise<Raw> {
  return req(server, '/v1/runs', { method: 'POST', json: { model: 'qwen', ...body }, headers });
}

async function createOk(server: TestServer, body: Record<string, unknown>): Promise<any> {
  const res = await create(server, body);
  expect(res.status, res.text).toBe(201);
  expect(res.body.status).toBe('validating');
  return res.body;
}

/** Polls the run until it leaves `validating` (or reaches one of `statuses`). */
async function settle(server: TestServer, id: string, statuses = ['queued', 'failed']): Promise<any> {
  return waitFor(
    `run ${id} in ${statuses.join('|')}`,
    async () => {
      const r = await req(server, `/v1/runs/${id}`);
      return statuses.includes(r.body.status) ? r.body : undefined;
    },
    60_000,
  );
}

async function sample(server: TestServer, runId: string, customId: string): Promise<any> {
  const res = await req(server, `/v1/runs/${runId}/samples/${encodeURIComponent(customId)}`);
  expect(res.status, res.text).toBe(200);
  return res.body;
}

async function allPages(server: TestServer, path: string): Promise<any[]> {
  const out: any[] = [];
  let after: string | null = null;
  for (;;) {
    const sep = path.includes('?') ? '&' : '?';
    const res: Raw = await req(server, `${path}${sep}limit=1000${after ? `&after=${encodeURIComponent(after)}` : ''}`);
    expect(res.status, res.text).toBe(200);
    out.push(...res.body.data);
    if (!res.body.has_more) return out;
    after = res.body.last_id;
  }
}

/** request_counts must agree with the samples themselves. */
async function expectCountsMatchSamples(server: TestServer, runId: string) {
  const run = (await req(server, `/v1/runs/${runId}`)).body;
  const rows = await allPages(server, `/v1/runs/${runId}/samples`);
  const recount = { total: rows.length, pending: 0, in_progress: 0, completed: 0, failed: 0, cancelled: 0 } as Record<string, number>;
  for (const s of rows) recount[s.status]++;
  expect(run.request_counts).toEqual(recount);
  for (const status of ['pending', 'completed', 'cancelled']) {
    const filtered = await allPages(server, `/v1/runs/${runId}/samples?status=${status}`);
    expect(filtered.length).toBe(recount[status]);
  }
}

const msg = (content: string, role = 'user') => ({ role, content });
const jsonl = (rows: unknown[]) => rows.map((r) => (typeof r === 'string' ? r : JSON.stringify(r))).join('\n') + '\n';
const nativeLines = (n: number, tag = 's') => jsonl(Array.from({ length: n }, (_, i) => ({ custom_id: `${tag}-${i}`, messages: [msg(`q ${i}`)] })));

describe('creating a run', () => {
  it('from a file_id: validates, queues, and counts every sample', async () => {
    const fileId = await upload(api, nativeLines(12));
    const created = await createOk(api, { name: 'from-file', input: { file_id: fileId }, params: { temperature: 0.6 }, metadata: { team: 'a' } });
    expect(created).toMatchObject({ object: 'run', name: 'from-file', model: 'qwen', params: { temperature: 0.6 }, metadata: { team: 'a' } });
    expect(created.id).toMatch(/^run_/);
    expect(new Date(created.created_at).toISOString()).toBe(created.created_at);
    const run = await settle(api, created.id);
    expect(run.status).toBe('queued');
    expect(run.request_counts).toMatchObject({ total: 12, pending: 12, in_progress: 0, completed: 0, failed: 0 });
    expect(run.shards).toEqual({ total: 1, uploaded: 0 });
    expect(run.invalid_lines).toEqual({ count: 0, errors: [] });
    await expectCountsMatchSamples(api, run.id);
  });

  it('from inline requests', async () => {
    const created = await createOk(api, { input: { requests: [{ custom_id: 'x', messages: [msg('hi')] }, { prompt: 'plain' }] } });
    const run = await settle(api, created.id);
    expect(run.request_counts.total).toBe(2);
    expect((await sample(api, run.id, 'x')).messages).toEqual([msg('hi')]);
    expect((await sample(api, run.id, 'line-2')).messages).toEqual([msg('plain')]);
  });

  it('from a file:// URI inside the data folder', async () => {
    const dir = join(api.config.dataDir, 'inputs');
    mkdirSync(dir, { recursive: true });
    const path = join(dir, 'local.jsonl');
    writeFileSync(path, nativeLines(3, 'local'));
    const run = await settle(api, (await createOk(api, { input: { uri: pathToFileURL(path).href } })).id);
    expect(run.status).toBe('queued');
    expect(run.request_counts.total).toBe(3);
    expect((await sample(api, run.id, 'local-2')).messages).toEqual([msg('q 2')]);
  });

  it('refuses file:// URIs outside the data folder, symlinks leading out, and other schemes, naming input.uri', async () => {
    writeFileSync(join(outside.dir, 'secret.jsonl'), nativeLines(1));
    const link = join(api.config.dataDir, 'leak.jsonl');
    symlinkSync(join(outside.dir, 'secret.jsonl'), link);
    const uris = [
      'file:///etc/passwd',
      pathToFileURL(join(outside.dir, 'secret.jsonl')).href,
      pathToFileURL(link).href,
      `${pathToFileURL(api.config.dataDir).href}/../../etc/passwd`,
      pathToFileURL(join(api.config.dataDir, 'missing.jsonl')).href,
      pathToFileURL(api.config.dataDir).href,
      'http://169.254.169.254/latest/meta-data/',
      'https://example.com/input.jsonl',
      's3://',
      's3://bucket/',
      's3://bucket/../x.jsonl',
      'ftp://host/x.jsonl',
      '/etc/passwd',
    ];
    const before = (await allPages(api, '/v1/runs')).length;
    for (const uri of uris) {
      const res = await create(api, { input: { uri } });
      expect(res.status, uri).toBeGreaterThanOrEqual(400);
      expect(res.status, uri).toBeLessThan(500);
      expectProblem(res, res.status, undefined, 'input.uri');
      expect(res.text).not.toContain(outside.dir);
    }
    expect((await allPages(api, '/v1/runs')).length).toBe(before);
  });

  it('accepts an s3:// key, and fails it in validating with a plain reason when the store is unreachable', async () => {
    // REGEN_S3_ENDPOINT points at a closed loopback port: the object cannot be read.
    const run = await settle(api, (await createOk(api, { input: { uri: 's3://regen-inputs/runs/input.jsonl' } })).id);
    expect(run.status).toBe('failed');
    expect(run.status_reason).toMatch(/input/);
    expect(run.status_reason).not.toMatch(/127\.0\.0\.1|Error|at \//);
  });

  it('refuses an output.uri outside the data folder', async () => {
    expectProblem(await create(api, { input: { requests: [{ prompt: 'x' }] }, output: { uri: 'file:///etc/' } }), 422, 'validation_failed', 'output.uri');
    expectProblem(
      await create(api, { input: { requests: [{ prompt: 'x' }] }, output: { uri: 'http://169.254.169.254/' } }),
      422,
      'validation_failed',
      'output.uri',
    );
  });

  it('refuses an output.uri another run already writes to', async () => {
    const uri = `${pathToFileURL(api.config.dataDir).href}/shared-output/`;
    const first = await createOk(api, { input: { requests: [{ prompt: 'x' }] }, output: { uri } });
    const res = await create(api, { input: { requests: [{ prompt: 'y' }] }, output: { uri } });
    expectProblem(res, 409, 'conflict', 'output.uri');
    expect(res.text).toContain(first.id);
  });

  it('refuses an output.uri longer than an S3 key may be, in characters or in bytes', async () => {
    const root = `${pathToFileURL(api.config.dataDir).href}/`;
    expectProblem(
      await create(api, { input: { requests: [{ prompt: 'x' }] }, output: { uri: root + 'a'.repeat(1100) } }),
      422,
      'validation_failed',
      'output.uri',
    );
    // 700 characters, 1,400 bytes: the prefix's index holds bytes.
    expectProblem(
      await create(api, { input: { requests: [{ prompt: 'x' }] }, output: { uri: root + 'é'.repeat(700) } }),
      422,
      'validation_failed',
      'output.uri',
    );
  });

  it('gives an output.uri to one run when many ask for it at once, and tells the others whose it is', async () => {
    const uri = `${pathToFileURL(api.config.dataDir).href}/raced-output/`;
    const fileId = await upload(api, '{"prompt":"x"}\n');
    const answers = await Promise.all(Array.from({ length: 12 }, () => create(api, { input: { file_id: fileId }, output: { uri } })));
    const made = answers.filter((r) => r.status === 201);
    expect(made, answers.map((r) => r.status).join(',')).toHaveLength(1);
    for (const res of answers.filter((r) => r.status !== 201)) {
      expectProblem(res, 409, 'conflict', 'output.uri');
      expect(res.text).toContain(made[0].body.id);
    }
    // With one Idempotency-Key too, the repeats are the same run, not a conflict.
    const keyed = `${pathToFileURL(api.config.dataDir).href}/raced-keyed-output/`;
    const again = await Promise.all(
      Array.from({ length: 12 }, () => create(api, { input: { file_id: fileId }, output: { uri: keyed } }, { 'idempotency-key': 'raced-output-key' })),
    );
    expect(new Set(again.map((r) => `${r.status} ${r.body.id}`)).size, again.map((r) => r.text).join('\n')).toBe(1);
  });

  it('answers 404 naming input.file_id for an unknown file', async () => {
    expectProblem(await create(api, { input: { file_id: 'file_nope' } }), 404, 'not_found', 'input.file_id');
  });
});

describe('input formats', () => {
  const lines = [
    { custom_id: 'native', messages: [msg('be brief', 'system'), msg('native q')], params: { temperature: 0.1 } },
    {
      custom_id: 'batch',
      method: 'POST',
      url: '/v1/chat/completions',
      body: { model: 'qwen', messages: [msg('batch q')], max_tokens: 77 },
    },
    {
      id: 'sharegpt',
      conversations: [
        { from: 'system', value: 'sys' },
        { from: 'human', value: 'share q' },
        { from: 'gpt', value: 'old answer' },
      ],
    },
    { id: 42, prompt: 'plain q' },
    { messages: [msg('no id')] },
    { custom_id: 'native-trailing', messages: [msg('first'), msg('old', 'assistant')] },
  ];

  it('turns each format into the right messages, and names id-less lines line-<n>', async () => {
    const run = await settle(api, (await createOk(api, { input: { file_id: await upload(api, jsonl(lines)) } })).id);
    expect(run.status).toBe('queued');
    expect(run.request_counts.total).toBe(6);
    const native = await sample(api, run.id, 'native');
    expect(native.messages).toEqual([msg('be brief', 'system'), msg('native q')]);
    expect(native.params).toEqual({ temperature: 0.1 });
    const batch = await sample(api, run.id, 'batch');
    expect(batch.messages).toEqual([msg('batch q')]);
    expect(batch.params).toEqual({ max_tokens: 77 });
    expect((await sample(api, run.id, 'sharegpt')).messages).toEqual([msg('sys', 'system'), msg('share q'), msg('old answer', 'assistant')]);
    expect((await sample(api, run.id, '42')).messages).toEqual([msg('plain q')]);
    expect((await sample(api, run.id, 'line-5')).messages).toEqual([msg('no id')]);
    // Without `regenerate`, a trailing assistant turn is sent as it is.
    expect((await sample(api, run.id, 'native-trailing')).messages).toEqual([msg('first'), msg('old', 'assistant')]);

    const ids = (await allPages(api, `/v1/runs/${run.id}/samples`)).map((s) => s.custom_id);
    expect(ids).toEqual(['native', 'batch', 'sharegpt', '42', 'line-5', 'native-trailing']);
  });

  it('regenerate: "last_assistant" drops the trailing assistant turn, and only that', async () => {
    const run = await settle(api, (await createOk(api, { regenerate: 'last_assistant', input: { file_id: await upload(api, jsonl(lines)) } })).id);
    expect(run.status).toBe('queued');
    expect(run.regenerate).toBe('last_assistant');
    expect((await sample(api, run.id, 'sharegpt')).messages).toEqual([msg('sys', 'system'), msg('share q')]);
    expect((await sample(api, run.id, 'native-trailing')).messages).toEqual([msg('first')]);
    expect((await sample(api, run.id, 'native')).messages).toEqual([msg('be brief', 'system'), msg('native q')]);
  });

  it('custom_ids `.`, `..` and others a URL parser changes are fetched by query; by path, they never reach another route', async () => {
    const ids = ['.', '..', '...', 'a/b', '%2e', '?x', '#y'];
    const run = await settle(api, (await createOk(api, { input: { requests: ids.map((id) => ({ custom_id: id, prompt: `q ${id}` })) } })).id);
    expect(run.status).toBe('queued');
    for (const id of ids) {
      const byQuery = await req(api, `/v1/runs/${run.id}/sample?custom_id=${encodeURIComponent(id)}`);
      expect(byQuery.status, `${id}: ${byQuery.text}`).toBe(200);
      expect(byQuery.body).toMatchObject({ custom_id: id, messages: [msg(`q ${id}`)] });
    }
    expect((await req(api, `/v1/runs/${run.id}/sample?custom_id=.&sample_index=1`)).status).toBe(404);
    expectProblem(await req(api, `/v1/runs/${run.id}/sample`), 422, 'validation_failed', 'custom_id');
    // In a path, fetch removes `.` and `..` even percent-encoded: what arrives is the run's sample list or the run, never another sample.
    expect((await sample(api, run.id, '...')).custom_id).toBe('...');
    expect((await sample(api, run.id, 'a/b')).custom_id).toBe('a/b');
    const dotted = await req(api, `/v1/runs/${run.id}/samples/${encodeURIComponent('..')}`);
    expect(dotted.body.custom_id).toBeUndefined();
  });

  it('a batch line asking for another model is an invalid line', async () => {
    const text = jsonl([{ custom_id: 'b', method: 'POST', url: '/v1/chat/completions', body: { model: 'other', messages: [msg('q')] } }]);
    const run = await settle(api, (await createOk(api, { input: { file_id: await upload(api, text) } })).id);
    expect(run.status).toBe('failed');
    expect(run.invalid_lines.errors[0]).toMatchObject({ line: 1, custom_id: 'b' });
  });
});

describe('invalid lines', () => {
  const tenWithBroken = (broken: number[]) =>
    jsonl(
      Array.from({ length: 10 }, (_, i) =>
        broken.includes(i + 1) ? '{"custom_id": "oops", "messages": [' : { custom_id: `l${i + 1}`, messages: [msg(`q${i + 1}`)] },
      ),
    );

  it('a broken line 7 fails the run in validating, naming line 7', async () => {
    const run = await settle(api, (await createOk(api, { input: { file_id: await upload(api, tenWithBroken([7])) } })).id);
    expect(run.status).toBe('failed');
    expect(run.status_reason).toMatch(/line 7\b/);
    expect(run.invalid_lines.count).toBe(1);
    expect(run.invalid_lines.errors).toHaveLength(1);
    expect(run.invalid_lines.errors[0].line).toBe(7);
    expect(run.invalid_lines.errors[0].message).toMatch(/JSON/);
    expect(run.request_counts.total).toBe(0);
    expect((await req(api, `/v1/runs/${run.id}/samples`)).body.data).toEqual([]);
    expect((await req(api, `/v1/runs/${run.id}/shards`)).body.data).toEqual([]);
    expect(run.finished_at).not.toBeNull();
  });

  it('on_invalid_line "skip" counts and lists the skipped lines and queues the rest', async () => {
    const run = await settle(api, (await createOk(api, { on_invalid_line: 'skip', input: { file_id: await upload(api, tenWithBroken([3, 8])) } })).id);
    expect(run.status).toBe('queued');
    expect(run.invalid_lines.count).toBe(2);
    expect(run.invalid_lines.errors.map((e: any) => e.line)).toEqual([3, 8]);
    expect(run.status_reason).toMatch(/2 invalid line/);
    expect(run.request_counts.total).toBe(8);
    const ids = (await allPages(api, `/v1/runs/${run.id}/samples`)).map((s) => s.custom_id);
    expect(ids).toEqual(['l1', 'l2', 'l4', 'l5', 'l6', 'l7', 'l9', 'l10']);
    await expectCountsMatchSamples(api, run.id);
  });

  it('reports a duplicate custom_id with the line it is repeated on', async () => {
    const text = jsonl([
      { custom_id: 'a', messages: [msg('1')] },
      { custom_id: 'b', messages: [msg('2')] },
      { custom_id: 'a', messages: [msg('3')] },
      { custom_id: 'c', messages: [msg('4')] },
    ]);
    const failed = await settle(api, (await createOk(api, { input: { file_id: await upload(api, text) } })).id);
    expect(failed.status).toBe('failed');
    expect(failed.invalid_lines.errors).toEqual([{ line: 3, custom_id: 'a', message: expect.stringMatching(/duplicate/) }]);
    expect(failed.status_reason).toMatch(/line 3\b/);

    const skipped = await settle(api, (await createOk(api, { on_invalid_line: 'skip', input: { file_id: await upload(api, text) } })).id);
    expect(skipped.status).toBe('queued');
    expect(skipped.request_counts.total).toBe(3);
    expect(skipped.invalid_lines.errors).toEqual([{ line: 3, custom_id: 'a', message: expect.stringMatching(/duplicate/) }]);
    expect((await sample(api, skipped.id, 'a')).messages).toEqual([msg('1')]);
  });

  it("checks a line's own params like the run's: streaming and n>1 are invalid lines", async () => {
    const text = jsonl([
      { custom_id: 'ok', messages: [msg('q')], params: { temperature: 0.2, custom_knob: 'kept' } },
      { custom_id: 'streams', messages: [msg('q')], params: { stream: true } },
      { custom_id: 'many', method: 'POST', url: '/v1/chat/completions', body: { messages: [msg('q')], n: 4 } },
      { custom_id: 'cold', prompt: 'q', params: { temperature: -1 } },
    ]);
    const run = await settle(api, (await createOk(api, { on_invalid_line: 'skip', input: { file_id: await upload(api, text) } })).id);
    expect(run.status).toBe('queued');
    expect(run.request_counts.total).toBe(1);
    expect(run.invalid_lines.errors.map((e: any) => [e.line, e.message.split(':')[0]])).toEqual([
      [2, 'params.stream'],
      [3, 'body.n'],
      [4, 'params.temperature'],
    ]);
    expect((await sample(api, run.id, 'ok')).params).toEqual({ temperature: 0.2, custom_knob: 'kept' });
  });

  it('lists the first 100 errors and counts them all', async () => {
    const rows = Array.from({ length: 150 }, (_, i) => (i % 2 ? 'nope' : { custom_id: `ok${i}`, messages: [msg('q')] }));
    const run = await settle(api, (await createOk(api, { on_invalid_line: 'skip', input: { file_id: await upload(api, jsonl(rows)) } })).id);
    expect(run.status).toBe('queued');
    expect(run.invalid_lines.count).toBe(75);
    expect(run.invalid_lines.errors).toHaveLength(75);
    expect(run.request_counts.total).toBe(75);
  });

  it('a file with no valid line fails', async () => {
    const run = await settle(api, (await createOk(api, { on_invalid_line: 'skip', input: { file_id: await upload(api, 'x\ny\n') } })).id);
    expect(run.status).toBe('failed');
    expect(run.invalid_lines.count).toBe(2);
  });
});

describe('shards', () => {
  it('a 2,500-line upload becomes 2,500 samples in 3 shards of 1,000', async () => {
    const run = await settle(api, (await createOk(api, { input: { file_id: await upload(api, nativeLines(2500)) } })).id);
    expect(run.status).toBe('queued');
    expect(run.shard_size).toBe(1000);
    expect(run.request_counts.total).toBe(2500);
    expect(run.shards).toEqual({ total: 3, uploaded: 0 });
    const shards = (await req(api, `/v1/runs/${run.id}/shards`)).body;
    expect(shards.has_more).toBe(false);
    expect(shards.data.map((s: any) => [s.index, s.samples, s.status, s.done])).toEqual([
      [0, 1000, 'open', 0],
      [1, 1000, 'open', 0],
      [2, 500, 'open', 0],
    ]);
    const paged = (await req(api, `/v1/runs/${run.id}/shards?limit=2`)).body;
    expect(paged.has_more).toBe(true);
    expect(paged.last_id).toBe('1');
    const rest = (await req(api, `/v1/runs/${run.id}/shards?limit=2&after=1`)).body;
    expect(rest.data.map((s: any) => s.index)).toEqual([2]);
    expect((await sample(api, run.id, 's-999')).shard).toBe(0);
    expect((await sample(api, run.id, 's-1000')).shard).toBe(1);
    expect(await sample(api, run.id, 's-2499')).toMatchObject({ shard: 2, index: 2499 });
    await expectCountsMatchSamples(api, run.id);
  });

  it('honours shard_size', async () => {
    const run = await settle(api, (await createOk(api, { shard_size: 7, input: { file_id: await upload(api, nativeLines(20)) } })).id);
    const shards = await allPages(api, `/v1/runs/${run.id}/shards`);
    expect(shards.map((s) => s.samples)).toEqual([7, 7, 6]);
  });
});

describe('Idempotency-Key', () => {
  it('the same body returns the same run; a different body is a 409', async () => {
    const fileId = await upload(api, nativeLines(3));
    const key = `key-${Date.now()}`;
    const body = { input: { file_id: fileId }, name: 'idem' };
    const before = (await allPages(api, '/v1/runs')).length;
    const first = await create(api, body, { 'idempotency-key': key });
    expect(first.status).toBe(201);
    const second = await create(api, body, { 'idempotency-key': key });
    expect(second.status).toBe(201);
    expect(second.body.id).toBe(first.body.id);
    expect(second.headers.get('idempotent-replayed')).toBe('true');
    expect((await allPages(api, '/v1/runs')).length).toBe(before + 1);

    const conflict = await create(api, { ...body, name: 'other' }, { 'idempotency-key': key });
    expectProblem(conflict, 409, 'idempotency_conflict');
    expect((await allPages(api, '/v1/runs')).length).toBe(before + 1);

    // Without a key, each request is a new run.
    const a = await create(api, body);
    const b = await create(api, body);
    expect(a.body.id).not.toBe(b.body.id);
  });

  it('concurrent requests with one key make one run', async () => {
    const key = `race-${Date.now()}`;
    const body = { input: { requests: [{ prompt: 'x' }] } };
    const before = (await allPages(api, '/v1/runs')).length;
    const results = await Promise.all(Array.from({ length: 5 }, () => create(api, body, { 'idempotency-key': key })));
    expect(new Set(results.map((r) => r.status))).toEqual(new Set([201]));
    expect(new Set(results.map((r) => r.body.id)).size).toBe(1);
    expect((await allPages(api, '/v1/runs')).length).toBe(before + 1);
  });
});

describe('listing runs', () => {
  it('filters by ?status= and pages with limit, after, has_more, last_id', async () => {
    const made: string[] = [];
    for (let i = 0; i < 5; i++) made.push((await createOk(api, { name: `list-${i}`, input: { requests: [{ prompt: `p${i}` }] } })).id);
    for (const id of made) await settle(api, id);
    const all = await allPages(api, '/v1/runs');
    expect(all.map((r) => r.id)).toEqual(expect.arrayContaining(made));
    // Newest first.
    const positions = made.map((id) => all.findIndex((r) => r.id === id));
    expect([...positions].sort((x, y) => y - x)).toEqual(positions);

    const seen: string[] = [];
    let after: string | null = null;
    for (let pages = 0; ; pages++) {
      expect(pages).toBeLessThan(100);
      const res: Raw = await req(api, `/v1/runs?limit=2${after ? `&after=${after}` : ''}`);
      expect(res.body.data.length).toBeLessThanOrEqual(2);
      expect(res.body.last_id).toBe(res.body.data.at(-1)?.id ?? null);
      seen.push(...res.body.data.map((r: any) => r.id));
      if (!res.body.has_more) break;
      after = res.body.last_id;
    }
    expect(seen).toEqual(all.map((r) => r.id));

    const queued = await allPages(api, '/v1/runs?status=queued');
    expect(queued.length).toBeGreaterThan(0);
    expect(queued.every((r) => r.status === 'queued')).toBe(true);
    expect(queued.map((r) => r.id)).toEqual(expect.arrayContaining(made));
    const failed = await allPages(api, '/v1/runs?status=failed');
    expect(failed.every((r) => r.status === 'failed')).toBe(true);
    expect(failed.map((r) => r.id)).not.toContain(made[0]);
    expect(queued.length + failed.length).toBe(all.filter((r) => r.status === 'queued' || r.status === 'failed').length);

    expectProblem(await req(api, '/v1/runs?status=done'), 422, 'validation_failed', 'status');
    expectProblem(await req(api, '/v1/runs?limit=0'), 422, 'validation_failed', 'limit');
  });

  it('filters by a part of the name in any case, non-ASCII capitals too, the same on both stores', async () => {
    const names = ['Étude Ω-7', 'ÉTUDE ω-8', 'straße', 'plain-name'];
    const made = new Map<string, string>();
    for (const name of names) made.set((await createOk(api, { name, input: { requests: [{ prompt: name }] } })).id, name);
    const found = async (part: string) =>
      (await allPages(api, `/v1/runs?name=${encodeURIComponent(part)}`))
        .filter((r) => made.has(r.id))
        .map((r) => r.name as string)
        .sort();
    expect(await found('étude')).toEqual(['ÉTUDE ω-8', 'Étude Ω-7']);
    expect(await found('Étude Ω')).toEqual(['ÉTUDE ω-8', 'Étude Ω-7']);
    expect(await found('ω-8')).toEqual(['ÉTUDE ω-8']);
    expect(await found('STRASSE')).toEqual([]);
    expect(await found('Straße')).toEqual(['straße']);
    // LIKE's own characters are literal.
    expect(await found('%')).toEqual([]);
  });

  it('refuses a cursor it cannot place with 422 naming after; an id of its making that it does not hold is placed where it sorts', async () => {
    const made: string[] = [];
    for (let i = 0; i < 2; i++) made.push((await createOk(api, { name: `cursor-${i}`, input: { requests: [{ prompt: `p${i}` }] } })).id);
    const future = `run_${(Date.now() + 86_400_000).toString(36).padStart(9, '0')}${'0'.repeat(16)}`;
    for (const after of ['run_0', `run_${'z'.repeat(60)}`, future, made[0]!.replace('run_', 'file_'), 'nope']) {
      const res = await req(api, `/v1/runs?after=${after}`);
      expectProblem(res, 422, 'validation_failed', 'after');
    }
    // As the cursor of a run gone since its page was read would be: the page goes on from where it stood.
    const gone = `${made[1]!.slice(0, 'run_'.length + 9)}${'0'.repeat(16)}`;
    const next = await req(api, `/v1/runs?limit=1&after=${gone}`);
    expect(next.status, next.text).toBe(200);
    expect(next.body.data[0].id).toBe(made[0]);
    expect((await req(api, `/v1/runs?limit=1&after=${made[1]}`)).body.data[0].id).toBe(made[0]);
    for (const id of made) await settle(api, id);
  });
});

describe('pause, resume, cancel', () => {
  it('moves a queued run through paused and back, and refuses bad transitions with 409', async () => {
    const run = await settle(live, (await createOk(live, { input: { file_id: await upload(live, nativeLines(30)) } })).id);
    expect(run.status).toBe('queued');

    expectProblem(await req(live, `/v1/runs/${run.id}/resume`, { method: 'POST' }), 409, 'conflict');
    const paused = await req(live, `/v1/runs/${run.id}/pause`, { method: 'POST' });
    expect(paused.status, paused.text).toBe(200);
    expect(paused.body.status).toBe('paused');
    expect((await req(live, `/v1/runs/${run.id}`)).body.status).toBe('paused');
    expectProblem(await req(live, `/v1/runs/${run.id}/pause`, { method: 'POST' }), 409, 'conflict');

    const resumed = await req(live, `/v1/runs/${run.id}/resume`, { method: 'POST', json: {} });
    expect(resumed.status, resumed.text).toBe(200);
    expect(resumed.body.status).toBe('queued');

    const cancelling = await req(live, `/v1/runs/${run.id}/cancel`, { method: 'POST' });
    expect(cancelling.status, cancelling.text).toBe(200);
    expect(['cancelling', 'cancelled']).toContain(cancelling.body.status);
    const cancelled = await settle(live, run.id, ['cancelled']);
    expect(cancelled.finished_at).not.toBeNull();
    expect(cancelled.request_counts).toMatchObject({ total: 30, pending: 0, in_progress: 0, completed: 0 });
    await expectCountsMatchSamples(live, run.id);

    for (const action of ['pause', 'resume', 'cancel']) {
      expectProblem(await req(live, `/v1/runs/${run.id}/${action}`, { method: 'POST' }), 409, 'conflict');
    }
  });

  it('cancels a paused run', async () => {
    const run = await settle(live, (await createOk(live, { input: { requests: [{ prompt: 'a' }, { prompt: 'b' }] } })).id);
    expect((await req(live, `/v1/runs/${run.id}/pause`, { method: 'POST' })).status).toBe(200);
    expect((await req(live, `/v1/runs/${run.id}/cancel`, { method: 'POST' })).status).toBe(200);
    const done = await settle(live, run.id, ['cancelled']);
    await expectCountsMatchSamples(live, done.id);
  });

  it('cancels a run that is still validating, and it never queues (or, validated meanwhile, cancels it queued)', async () => {
    const created = await createOk(api, { input: { file_id: await upload(api, nativeLines(50_000, 'long')) } });
    const res = await req(api, `/v1/runs/${created.id}/cancel`, { method: 'POST' });
    // Refused never: a run whose input is accepted while the cancel is on its way is cancelled as a queued one.
    expect(res.status, res.text).toBe(200);
    if (res.body.status !== 'cancelling') {
      expect(res.body.status).toBe('cancelled');
      // The ingestion notices within a batch of lines and clears what it had inserted.
      await waitFor('the cancelled validation to clear its samples', async () =>
        (await req(api, `/v1/runs/${created.id}/samples?limit=1`)).body.data.length === 0 ? true : undefined,
      );
      const after = (await req(api, `/v1/runs/${created.id}`)).body;
      expect(after.status).toBe('cancelled');
      expect(after.request_counts.total).toBe(0);
      expect(after.shards.total).toBe(0);
      expect((await req(api, `/v1/runs/${created.id}/shards`)).body.data).toEqual([]);
      await expectCountsMatchSamples(api, created.id);
    } else {
      // Validation won the race: the run was queued, so cancelling asks the runner (none runs here).
      expect((await req(api, `/v1/runs/${created.id}`)).body.status).toBe('cancelling');
    }
  });

  it('a cancel that meets the input being accepted cancels the queued run instead of refusing it', async () => {
    const { deps } = api;
    // The input is accepted (validating → queued, as the ingest does) after the cancel read the
    // run as validating and before its own move: the moment a fast validation can meet a cancel.
    // The ingest of 50,000 lines takes long enough that the cancel reads it validating; should the
    // ingest still win, the forced move finds the run queued and the attempt is made again.
    for (let attempt = 1; ; attempt++) {
      const created = await createOk(api, { input: { file_id: await upload(api, nativeLines(50_000, `accepted${attempt}`)) } });
      let accepted: boolean | undefined;
      const db = new Proxy(deps.db, {
        get(target, key) {
          if (key === 'tx' && accepted === undefined) {
            return async <T>(fn: (tx: Db) => Promise<T>) => {
              accepted = await transitionRun(target, created.id, ['validating'], 'queued', deps.clock());
              return target.tx(fn);
            };
          }
          const value = Reflect.get(target, key, target);
          return typeof value === 'function' ? value.bind(target) : value;
        },
      });
      const run = await cancelRun({ ...deps, db }, created.id);
      if (accepted === false && attempt < 5) continue;
      expect(accepted, 'the input was accepted between the cancel’s read and its move').toBe(true);
      expect(run.status).toBe('cancelling');
      const moves = (await eventsAfter(deps.db, created.id, 0)).filter((e) => e.type === 'status').map((e) => e.data.status);
      expect(moves).toEqual(['validating', 'queued', 'cancelling']);
      expect((await req(api, `/v1/runs/${created.id}`)).body.status).toBe('cancelling');
      return;
    }
  });

  it('action bodies are validated: unknown keys 422, malformed JSON 400', async () => {
    const run = await settle(api, (await createOk(api, { input: { requests: [{ prompt: 'a' }] } })).id);
    expectProblem(await req(api, `/v1/runs/${run.id}/pause`, { method: 'POST', json: { now: true } }), 422, 'validation_failed', 'now');
    expectProblem(
      await req(api, `/v1/runs/${run.id}/pause`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{' }),
      400,
      'invalid_request',
    );
    expectProblem(await req(api, `/v1/runs/${run.id}/retry`, { method: 'POST', json: { only: 'everything' } }), 422, 'validation_failed', 'only');
    expect((await req(api, `/v1/runs/${run.id}`)).body.status).toBe('queued');
  });

  it('actions on an unknown run are 404', async () => {
    for (const action of ['pause', 'resume', 'cancel', 'retry']) {
      expectProblem(await req(api, `/v1/runs/run_nope/${action}`, { method: 'POST' }), 404, 'not_found');
    }
  });
});

describe('errors', () => {
  it('GET of an unknown run, its samples, shards or a sample is a 404 problem', async () => {
    expectProblem(await req(api, '/v1/runs/run_doesnotexist'), 404, 'not_found');
    expectProblem(await req(api, '/v1/runs/run_doesnotexist/samples'), 404, 'not_found');
    expectProblem(await req(api, '/v1/runs/run_doesnotexist/shards'), 404, 'not_found');
    expectProblem(await req(api, '/v1/runs/run_doesnotexist/samples/x'), 404, 'not_found');
    const run = await settle(api, (await createOk(api, { input: { requests: [{ prompt: 'a' }] } })).id);
    expectProblem(await req(api, `/v1/runs/${run.id}/samples/nope`), 404, 'not_found');
    expectProblem(await req(api, '/v1/runs/bad%20id'), 422, 'validation_failed', 'id');
    // An unknown cursor is refused rather than silently restarting the listing.
    expectProblem(await req(api, `/v1/runs/${run.id}/samples?after=nope`), 422, 'validation_failed', 'after');
    expectProblem(await req(api, `/v1/runs/${run.id}/samples?status=done`), 422, 'validation_failed', 'status');
    expectProblem(await req(api, `/v1/runs/${run.id}/shards?after=x`), 422, 'validation_failed', 'after');
  });

  it('validation errors are 422 problems naming the field', async () => {
    const input = { requests: [{ prompt: 'x' }] };
    const cases: [Record<string, unknown>, string][] = [
      [{ input, params: { temperature: -3 } }, 'params.temperature'],
      [{ input, params: { stream: true } }, 'params.stream'],
      [{ input, params: { top_p: 0 } }, 'params.top_p'],
      [{ input, params: { max_tokens: 1.5 } }, 'params.max_tokens'],
      [{ input, params: { stop: 5 } }, 'params.stop'],
      [{ input, shard_size: 0 }, 'shard_size'],
      [{ input, shard_size: 1e12 }, 'shard_size'],
      [{ input, shard_size: '10' }, 'shard_size'],
      [{ input, model: '' }, 'model'],
      [{ input, model: 'x'.repeat(300) }, 'model'],
      [{ input, surprise: 1 }, 'surprise'],
      [{ input, on_invalid_line: 'ignore' }, 'on_invalid_line'],
      [{ input, regenerate: 'first_user' }, 'regenerate'],
      [{ input, priority: 1.5 }, 'priority'],
      [{ input, request_timeout_ms: 10 }, 'request_timeout_ms'],
      [{ input, max_attempts: 0 }, 'max_attempts'],
      [{ input, quality: { gate: { max_flag_rate: 2 } } }, 'quality.gate.max_flag_rate'],
      [{ input, metadata: { k: 5 } }, 'metadata.k'],
      [{ input: { requests: [] } }, 'input.requests'],
      [{ input: { file_id: 'file_a', uri: 'file:///x' } }, 'input'],
      [{ input: {} }, 'input'],
      [{}, 'input'],
    ];
    for (const [body, field] of cases) {
      const res = await create(api, body);
      expectProblem(res, 422, 'validation_failed', field);
    }
    const noModel = await req(api, '/v1/runs', { method: 'POST', json: { input } });
    expectProblem(noModel, 422, 'validation_failed', 'model');
    const notObject = await req(api, '/v1/runs', { method: 'POST', json: [1, 2] });
    expectProblem(notObject, 422, 'validation_failed');
  });

  it('validation messages name the limit that was passed, not the union it sits in', async () => {
    const tooMany = await create(api, { input: { requests: Array.from({ length: 100_001 }, () => ({ prompt: 'x' })) } });
    expectProblem(tooMany, 422, 'validation_failed', 'input.requests');
    expect(tooMany.body.detail).toMatch(/at most 100,000 requests/);
    const stops = await create(api, { input: { requests: [{ prompt: 'x' }] }, params: { stop: Array.from({ length: 33 }, (_, i) => `s${i}`) } });
    expectProblem(stops, 422, 'validation_failed', 'params.stop');
    expect(stops.body.detail).toMatch(/at most 32 stop strings/);
    // A line's own params say the same.
    const line = await settle(api, (await createOk(api, { input: { requests: [{ prompt: 'x', params: { stop: Array(33).fill('s') } }] } })).id);
    expect(line.invalid_lines.errors[0].message).toMatch(/^params\.stop: at most 32 stop strings/);
    // One key, but a value of the wrong kind, still names it; no key or two keys name input.
    expectProblem(await create(api, { input: { file_id: '' } }), 422, 'validation_failed', 'input.file_id');
    expectProblem(await create(api, { input: { requests: [], uri: 'file:///x' } }), 422, 'validation_failed', 'input');
  });

  it('reads a URI scheme in any case: FILE:/// is file:///', async () => {
    const dir = join(api.config.dataDir, 'inputs');
    mkdirSync(dir, { recursive: true });
    const path = join(dir, 'capitals.jsonl');
    writeFileSync(path, nativeLines(2, 'caps'));
    const href = pathToFileURL(path).href;
    const created = await createOk(api, { input: { uri: `FILE${href.slice('file'.length)}` } });
    expect(created.input).toEqual({ uri: href });
    const run = await settle(api, created.id);
    expect(run.status, run.status_reason).toBe('queued');
    expect(run.request_counts.total).toBe(2);
    const out = await createOk(api, {
      input: { requests: [{ prompt: 'x' }] },
      output: { uri: `File${pathToFileURL(join(api.config.dataDir, 'caps-out')).href.slice(4)}` },
    });
    expect(out.output_uri).toBe(`${pathToFileURL(realpathSync(api.config.dataDir)).href}/caps-out/`);
  });

  it('a malformed JSON body is a 400, a body that is not JSON a 415', async () => {
    for (const body of ['{"model": ', '{model: 1}', '']) {
      const res = await req(api, '/v1/runs', { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      expect([400, 422]).toContain(res.status);
      expectProblem(res, res.status);
    }
    expectProblem(await req(api, '/v1/runs', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model": ' }), 400, 'invalid_request');
    const plain = await req(api, '/v1/runs', {
      method: 'POST',
      headers: { 'content-type': 'text/plain' },
      body: JSON.stringify({ model: 'm', input: { requests: [{ prompt: 'x' }] } }),
    });
    expectProblem(plain, 415, 'unsupported_media_type');
  });

  it('a 20 MB JSON body is a 413, with or without a content-length', async () => {
    const big = JSON.stringify({ model: 'qwen', input: { requests: [{ prompt: 'x' }] }, name: 'y'.repeat(20 << 20) });
    expectProblem(await req(api, '/v1/runs', { method: 'POST', headers: { 'content-type': 'application/json' }, body: big }), 413, 'payload_too_large');
    const chunks = Buffer.from(big);
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let i = 0; i < chunks.length; i += 1 << 20) controller.enqueue(chunks.subarray(i, i + (1 << 20)));
        controller.close();
      },
    });
    const res = await req(api, '/v1/runs', { method: 'POST', headers: { 'content-type': 'application/json' }, body: stream, duplex: 'half' });
    expectProblem(res, 413, 'payload_too_large');
  });

  it('unknown routes are 404 problems', async () => {
    expectProblem(await req(api, '/v1/nothing-here'), 404, 'not_found');
  });
});
