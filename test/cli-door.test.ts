// The CLI at the door: run params checked before the upload, invalid lines with the flag that skips
// them, the warning and the reason of a run that waits, and `serve` on a busy port.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer as createHttpServer } from 'node:http';
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { registerEndpoint } from './support/runner-checks.js';
import { call, startTestServer, tempDir, waitFor } from './support/server.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SERVED = '/models/Qwen3-8B';

let server: Awaited<ReturnType<typeof startTestServer>>;
let sim: SimProcess;
const files = tempDir('regen-cli-door-');

interface Child {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `node bin/regen.js ...args`; `until` ends it with SIGINT once its stderr says so. */
async function regen(args: string[], until?: (stderr: string) => boolean, env: Record<string, string> = {}): Promise<Child> {
  const child = spawn(process.execPath, ['bin/regen.js', ...args], {
    cwd: ROOT,
    env: { ...process.env, REGEN_URL: server.url, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  let interrupted = false;
  child.stderr.on('data', (d: Buffer) => {
    stderr += d.toString();
    if (!interrupted && until?.(stderr)) interrupted = child.kill('SIGINT');
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), 90_000);
  const [code] = (await once(child, 'exit')) as [number | null];
  clearTimeout(timer);
  return { code, stdout, stderr };
}

function write(name: string, rows: unknown[]): string {
  const path = join(files.dir, name);
  writeFileSync(path, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return path;
}

const user = (content: string) => ({ role: 'user', content });
/** What the object store holds under files/ (nothing at all before the first upload). */
function storedFiles(): string[] {
  const objects = join(server.config.dataDir, 'objects');
  if (!existsSync(objects)) return [];
  return readdirSync(objects, { recursive: true })
    .map(String)
    .filter((f) => f.startsWith('files'));
}

beforeAll(async () => {
  [server, sim] = await Promise.all([startTestServer({ REGEN_PROBE_INTERVAL_MS: '200' }), spawnSimulator({ model: SERVED })]);
  const ep = await registerEndpoint(server.url, sim.url);
  await waitFor('the endpoint to say what it serves', async () =>
    (await call(server.url, `/v1/endpoints/${ep.id}`)).body.model === SERVED ? true : undefined,
  );
});
afterAll(async () => {
  await server?.cleanup();
  await sim?.stop();
  files.cleanup();
});

describe('regen submit at the door', () => {
  it('refuses temperature=7 before a byte of the file is uploaded', async () => {
    const file = write('hot.jsonl', [{ custom_id: 'a', messages: [user('q')] }]);
    const before = storedFiles();
    // The CLI talks to the server through a proxy that notes every request it passes on.
    const seen: string[] = [];
    const proxy = createHttpServer(async (req, res) => {
      seen.push(`${req.method} ${req.url}`);
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      const body = chunks.length ? Buffer.concat(chunks) : undefined;
      const answer = await fetch(server.url + req.url, { method: req.method, headers: { 'content-type': req.headers['content-type'] ?? '' }, body });
      res.writeHead(answer.status, { 'content-type': answer.headers.get('content-type') ?? '' });
      res.end(Buffer.from(await answer.arrayBuffer()));
    }).listen(0, '127.0.0.1');
    await once(proxy, 'listening');
    try {
      const res = await regen([
        'submit',
        file,
        '--model',
        SERVED,
        '--param',
        'temperature=7',
        '--server',
        `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`,
      ]);
      expect(res.code).toBe(2);
      expect(res.stderr.trim()).toBe('regen: params.temperature: Too big: expected number to be <=2');
      expect(seen).toEqual(['POST /v1/runs/validate']);
    } finally {
      proxy.close();
    }
    expect(storedFiles()).toEqual(before);
    expect((await call(server.url, '/v1/files?limit=1000')).body.data).toEqual([]);
  });

  it('says which line is invalid and how to skip it; --on-invalid-line skip runs the rest', async () => {
    const file = write('roles.jsonl', [
      { custom_id: 'a', messages: [user('one')] },
      { custom_id: 'b', messages: [{ role: 'human', content: 'two' }] },
    ]);
    const failed = await regen(['submit', file, '--model', SERVED]);
    expect(failed.code, failed.stderr).toBe(1);
    expect(failed.stderr).toContain(
      'failed: input has 1 invalid line(s); first: line 2: messages[0].role "human" is not a chat role: write "user"; to run without them, create the run with on_invalid_line: "skip" (regen submit --on-invalid-line skip)',
    );

    const skipped = await regen(['submit', file, '--model', SERVED, '--on-invalid-line', 'skip', '--watch']);
    expect(skipped.code, skipped.stderr).toBe(0);
    const run = (await call(server.url, `/v1/runs/${skipped.stdout.trim()}`)).body;
    expect(run).toMatchObject({ status: 'completed', on_invalid_line: 'skip', request_counts: { total: 1, completed: 1 }, invalid_lines: { count: 1 } });
  });

  it('warns of a model no endpoint serves with the closest served name, and says why the run waits in submit, status and --watch', async () => {
    const file = write('typo.jsonl', [{ custom_id: 'a', messages: [user('q')] }]);
    const res = await regen(['submit', file, '--model', 'Qwen/Qwen3-8b']);
    expect(res.code, res.stderr).toBe(0);
    const runId = res.stdout.trim();
    const warning = `warning: model: model "Qwen/Qwen3-8b" is not served by any registered endpoint (did you mean "${SERVED}"?); the run waits until an endpoint serves it`;
    // Printed once, before the upload (from the check), though the create answers it again.
    expect(res.stderr.split('\n').filter((l) => l === warning)).toHaveLength(1);
    expect(res.stderr.indexOf(warning)).toBeLessThan(res.stderr.indexOf('uploading'));
    const waiting = `run ${runId} is queued (waiting for an endpoint: no ready endpoint serves model "Qwen/Qwen3-8b"; `;
    expect(res.stderr).toContain(waiting);

    const table = await regen(['status']);
    expect(table.code, table.stderr).toBe(0);
    const [header, ...rows] = table.stdout.trim().split('\n');
    expect(header).toMatch(/\bSTATUS\b.*\bREASON$/);
    expect(rows.find((l) => l.startsWith(runId))).toMatch(/\bqueued\b.*\bwaiting for an endpoint: no ready endpoint serves model "Qwen\/Qwen3-8b"; /);

    const watched = await regen(['status', runId, '--watch'], (stderr) => stderr.includes('queued (waiting for an endpoint: '));
    expect(watched.code).toBe(130);
    expect(watched.stderr).toContain('| queued (waiting for an endpoint: no ready endpoint serves model "Qwen/Qwen3-8b"; ');
    await call(server.url, `/v1/runs/${runId}/cancel`, { method: 'POST' });
  });
});

describe('regen status of a cancelled run', () => {
  it('shows what was answered, in the table, the detail and --watch, not 100%', async () => {
    const rows = Array.from({ length: 400 }, (_, i) => ({ custom_id: `c-${i}`, messages: [user(`question ${i}`)] }));
    const created = await call(server.url, '/v1/runs', { method: 'POST', json: { model: SERVED, quality: false, input: { requests: rows } } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const runId = created.body.id as string;
    await waitFor('the run to answer some samples', async () =>
      (await call(server.url, `/v1/runs/${runId}`)).body.request_counts.completed >= 10 ? true : undefined,
    );
    await call(server.url, `/v1/runs/${runId}/cancel`, { method: 'POST' });
    const run = await waitFor('the run to be cancelled', async () => {
      const r = (await call(server.url, `/v1/runs/${runId}`)).body;
      return r.status === 'cancelled' ? r : undefined;
    });
    const { completed, cancelled, total } = run.request_counts;
    expect(completed).toBeGreaterThan(0);
    expect(cancelled).toBeGreaterThan(0);
    // As a share is printed: 100 × (203/400) is 50.7499…, which prints as 50.7% (not 50.8%, as 100 × 203 / 400 would).
    const share = `${(100 * (completed / total)).toFixed(1)}%`;

    const table = await regen(['status']);
    expect(table.code, table.stderr).toBe(0);
    const row = table.stdout.split('\n').find((l) => l.startsWith(runId));
    expect(row).toMatch(new RegExp(`\\bcancelled\\s+${share.replace('.', '\\.')}\\s+${completed}/${total}\\s`));
    expect(row).not.toContain('100.0%');

    const detail = await regen(['status', runId]);
    expect(detail.stdout).toMatch(
      new RegExp(`^progress\\s+${share.replace('.', '\\.')}, ${completed} of ${total} samples answered · ${cancelled} cancelled$`, 'm'),
    );

    const watched = await regen(['status', runId, '--watch']);
    expect(watched.code).toBe(1);
    expect(watched.stderr).toContain(`${share} | ${completed}/${total} samples`);
    expect(watched.stderr).not.toContain('100.0%');
  });
});

describe('regen serve', () => {
  it('on a busy port says so in one line, naming the port and how to choose another, and exits non-zero', async () => {
    const busy = createServer().listen(0, '127.0.0.1');
    await once(busy, 'listening');
    const { port } = busy.address() as AddressInfo;
    const data = tempDir('regen-busy-');
    try {
      const res = await regen(['serve', '--port', String(port), '--data', data.dir], undefined, { REGEN_LOG_LEVEL: 'warn' });
      expect(res.code).not.toBe(0);
      expect(res.stderr).toBe(`regen: port ${port} on 127.0.0.1 is in use; choose another with --port or REGEN_PORT\n`);
      expect(res.stdout).not.toMatch(/EADDRINUSE|\n\s+at /);
    } finally {
      busy.close();
      data.cleanup();
    }
  });
});
