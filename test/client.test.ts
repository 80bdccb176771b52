import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
// The published entry point, by the package's own name, as another service imports it.
import { createRegenClient, RegenApiError, unwrap, type RegenClient } from 'regen/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, tempDir, waitFor } from './support/server.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TOKEN = 'client-test-token';

type TestServer = Awaited<ReturnType<typeof startTestServer>>;
let server: TestServer;
let client: RegenClient;
const dirs = tempDir('regen-client-');

/** Catches what `call` throws, so a test can look at the error. */
async function refusal(call: Promise<unknown>): Promise<RegenApiError> {
  const err = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RegenApiError);
  return err as RegenApiError;
}

describe('regen/client', () => {
  beforeAll(async () => {
    // No runner: the runs stay queued, which is all these calls need.
    server = await startTestServer({ REGEN_API_TOKENS: TOKEN, REGEN_RUNNER: 'false' });
    client = createRegenClient({ baseUrl: server.url, token: TOKEN });
  });

  afterAll(async () => {
    await server?.cleanup();
    dirs.cleanup();
  });

  it('creates a run, reads it back, lists it and pauses it', async () => {
    const created = await unwrap(
      client.POST('/v1/runs', {
        body: { name: 'typed', model: 'sim-model', input: { requests: [{ custom_id: 'a', messages: [{ role: 'user', content: 'hi' }] }] } },
      }),
    );
    expect(created.id).toMatch(/^run_/);
    const run = await unwrap(client.GET('/v1/runs/{id}', { params: { path: { id: created.id } } }));
    expect(run).toMatchObject({ id: created.id, name: 'typed', model: 'sim-model' });
    const list = await unwrap(client.GET('/v1/runs', { params: { query: { limit: 10 } } }));
    expect(list.data.map((r) => r.id)).toContain(created.id);
    // A run validates its input before it can be paused: wait for it to be queued.
    await waitFor('the run queued', async () => {
      const r = await unwrap(client.GET('/v1/runs/{id}', { params: { path: { id: created.id } } }));
      return r.status === 'queued' ? r : undefined;
    });
    const paused = await unwrap(client.POST('/v1/runs/{id}/pause', { params: { path: { id: created.id } } }));
    expect(paused.status).toBe('paused');
  });

  it('turns a refusal into a RegenApiError carrying the problem', async () => {
    const missing = await refusal(unwrap(client.GET('/v1/runs/{id}', { params: { path: { id: 'run_missing' } } })));
    expect(missing.status).toBe(404);
    expect(missing.problem).toMatchObject({ status: 404, code: 'not_found', title: 'Not Found' });
    expect(missing.title).toBe('Not Found');
    expect(missing.code).toBe('not_found');
    expect(missing.detail).toMatch(/run_missing/);
    expect(missing.message).toBe(missing.detail);

    // The Files and Batch routes answer OpenAI's envelope beside the problem's fields.
    const noFile = await refusal(unwrap(client.GET('/v1/files/{id}', { params: { path: { id: 'file_missing' } } })));
    expect(noFile.status).toBe(404);
    expect(noFile.code).toBe('not_found');
    expect(noFile.problem.error).toMatchObject({ message: noFile.detail, type: 'invalid_request_error', code: 'not_found' });

    const invalid = await refusal(
      unwrap(client.POST('/v1/runs', { body: { model: 'm', input: { requests: [{ prompt: 'x' }] }, params: { temperature: 9 } } })),
    );
    expect(invalid.status).toBe(422);
    expect(invalid.problem).toMatchObject({ code: 'validation_failed', field: 'params.temperature' });

    const anonymous = createRegenClient({ baseUrl: server.url });
    const unauthorized = await refusal(unwrap(anonymous.GET('/v1/runs')));
    expect(unauthorized.status).toBe(401);
    expect(unauthorized.code).toBe('unauthorized');
  });

  it('is checked by the compiler against the document', () => {
    // Never run: what tsc says about these lines is the test (`npx tsc --noEmit` fails if they compile).
    const typeChecks = () => {
      // @ts-expect-error a path the document does not have
      void client.GET('/v1/nope');
      // @ts-expect-error the run id is a required path parameter
      void client.GET('/v1/runs/{id}');
      // @ts-expect-error `url` is the field an endpoint is registered by
      void client.POST('/v1/endpoints', { body: { address: 'http://10.0.0.5:30000' } });
    };
    expect(typeChecks).toBeTypeOf('function');
  });

  it('is importable from another package that depends on regen', async () => {
    // A service of its own: regen in its node_modules, TypeScript run through tsx.
    const service = join(dirs.dir, 'service');
    mkdirSync(join(service, 'node_modules'), { recursive: true });
    symlinkSync(ROOT, join(service, 'node_modules', 'regen'), 'dir');
    writeFileSync(join(service, 'package.json'), JSON.stringify({ name: 'service', type: 'module', dependencies: { regen: '*' } }));
    writeFileSync(
      join(service, 'main.ts'),
      `import { createRegenClient, RegenApiError, unwrap } from 'regen/client';
const client = createRegenClient({ baseUrl: process.env.REGEN_URL!, token: process.env.REGEN_TOKEN });
const runs = await unwrap(client.GET('/v1/runs'));
const err = await unwrap(client.GET('/v1/runs/{id}', { params: { path: { id: 'run_missing' } } })).catch((e: RegenApiError) => e);
console.log(JSON.stringify({ runs: runs.data.length, status: (err as RegenApiError).status, code: (err as RegenApiError).code }));
`,
    );
    const { data: runs } = await unwrap(client.GET('/v1/runs'));
    const child = spawn(process.execPath, ['--import', import.meta.resolve('tsx/esm'), 'main.ts'], {
      cwd: service,
      env: { ...process.env, REGEN_URL: server.url, REGEN_TOKEN: TOKEN },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code, stderr).toBe(0);
    expect(JSON.parse(stdout)).toEqual({ runs: runs.length, status: 404, code: 'not_found' });
  });
});
