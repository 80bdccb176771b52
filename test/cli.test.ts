import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, REGEN, startTestServer, tempDir, waitFor } from './support/server.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TOKEN = 'cli-test-token';
const auth = { authorization: `Bearer ${TOKEN}` };

type TestServer = Awaited<ReturnType<typeof startTestServer>>;
let server: TestServer;
let sim: SimProcess;
const files = tempDir('regen-cli-');

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `regen ...args` as a user would run it, against the test server: compiled (bin/regen.js itself is cli-door.test.ts's). */
async function regen(args: string[], env: Record<string, string> = {}): Promise<Result> {
  const child = spawn(process.execPath, [...REGEN, ...args], {
    cwd: ROOT,
    env: { ...process.env, REGEN_URL: server.url, REGEN_TOKEN: TOKEN, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const timer = setTimeout(() => child.kill('SIGKILL'), 90_000);
  const [code] = (await once(child, 'exit')) as [number | null];
  clearTimeout(timer);
  return { code, stdout, stderr };
}

function prompts(name: string, n: number): string {
  const path = join(files.dir, name);
  const lines = Array.from({ length: n }, (_, i) =>
    JSON.stringify({
      custom_id: `${name}-${i}`,
      messages: [
        { role: 'user', content: `Explain Raft elections (question ${i}).` },
        { role: 'assistant', content: 'OK.' },
      ],
    }),
  );
  writeFileSync(path, lines.join('\n') + '\n');
  return path;
}

/** A loopback port nothing listens on. */
async function closedPort(): Promise<number> {
  const probe = createServer().listen(0, '127.0.0.1');
  await once(probe, 'listening');
  const { port } = probe.address() as AddressInfo;
  probe.close();
  await once(probe, 'close');
  return port;
}

const getRun = async (id: string) => (await call(server.url, `/v1/runs/${id}`, { headers: auth })).body;

describe('regen CLI', () => {
  beforeAll(async () => {
    [server, sim] = await Promise.all([
      startTestServer({ REGEN_API_TOKENS: TOKEN }),
      spawnSimulator({ 'max-running': 16, 'ttft-ms': 20, 'tokens-per-second': 4000 }),
    ]);
  });
  afterAll(async () => {
    await server?.cleanup();
    await sim?.stop();
    files.cleanup();
  });

  it('adds and lists endpoints', async () => {
    const add = await regen(['endpoints', 'add', sim.url, '--name', 'sim-a', '--max-concurrency', '8']);
    expect(add.code, add.stderr).toBe(0);
    expect(add.stdout).toMatch(/^ep_\S+\s+sim-a\s+/);
    const eps = await call(server.url, '/v1/endpoints', { headers: auth });
    expect(eps.body.data).toHaveLength(1);
    expect(eps.body.data[0]).toMatchObject({ name: 'sim-a', max_concurrency: 8, max_concurrency_source: 'user' });
    await waitFor('the endpoint to be ready', async () =>
      (await call(server.url, '/v1/endpoints', { headers: auth })).body.data[0].state === 'ready' ? true : undefined,
    );

    const list = await regen(['endpoints', 'list']);
    expect(list.code, list.stderr).toBe(0);
    const [header, row] = list.stdout.trim().split('\n');
    expect(header).toMatch(/^ENDPOINT\s+NAME\s+URL\s+MODEL\s+STATE/);
    expect(row).toContain('sim-a');
    expect(row).toContain(sim.url);
    expect(row).toMatch(/\bready\b/);

    // Lent by night in Paris, and the lend already over: off schedule until it is cleared.
    const id = eps.body.data[0].id;
    const set = await regen([
      'endpoints',
      'set',
      id,
      '--schedule',
      'mon-fri 20:00-07:00; sat,sun 00:00-24:00',
      '--timezone',
      'Europe/Paris',
      '--lend-until',
      '2020-01-01T00:00:00Z',
      '--request-priority',
      '-1',
      '--bulk-header',
      'on',
    ]);
    expect(set.code, set.stderr).toBe(0);
    expect(set.stdout).toContain('(off schedule)');
    expect((await call(server.url, `/v1/endpoints/${id}`, { headers: auth })).body).toMatchObject({
      schedule: [
        { days: ['mon', 'tue', 'wed', 'thu', 'fri'], from: '20:00', to: '07:00' },
        { days: ['sat', 'sun'], from: '00:00', to: '24:00' },
      ],
      timezone: 'Europe/Paris',
      lend_until: '2020-01-01T00:00:00.000Z',
      request_priority: -1,
      bulk_header: true,
    });
    expect((await regen(['endpoints', 'list'])).stdout).toMatch(/\boff_schedule\b/);
    const bad = await regen(['endpoints', 'set', id, '--schedule', 'evenings']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--schedule');
    const cleared = await regen(['endpoints', 'set', id, '--schedule', 'none', '--lend-until', 'none', '--request-priority', 'none', '--bulk-header', 'off']);
    expect(cleared.code, cleared.stderr).toBe(0);
    expect(cleared.stdout).not.toContain('off schedule');
    expect(row).toContain('0/8');
  });

  it('submits a file, watches it to completion and exits 0', async () => {
    const file = prompts('watched', 240);
    const res = await regen([
      'submit',
      file,
      '--model',
      'sim-model',
      '--param',
      'temperature=0.6',
      '--param',
      'chat_template_kwargs.enable_thinking=true',
      '--name',
      'cli-run',
      '--shard-size',
      '50',
      '--regenerate',
      'last_assistant',
      '--watch',
    ]);
    expect(res.code, res.stderr).toBe(0);
    const runId = res.stdout.trim().split('\n')[0];
    expect(runId).toMatch(/^run_[A-Za-z0-9_-]+$/);
    expect(res.stderr).toMatch(/\d+\.\d% \| \d+\/240 samples \| [\d.]+ samples\/s \| ETA/);
    expect(res.stderr).toContain(`run ${runId} completed`);
    expect(res.stderr).toContain('240 completed, 0 failed');

    const run = await getRun(runId);
    expect(run).toMatchObject({
      status: 'completed',
      name: 'cli-run',
      shard_size: 50,
      regenerate: 'last_assistant',
      params: { temperature: 0.6, chat_template_kwargs: { enable_thinking: true } },
      request_counts: { total: 240, completed: 240 },
      shards: { total: 5, uploaded: 5 },
    });
    expect(run.input.file_id).toMatch(/^file_/);

    const table = await regen(['status']);
    expect(table.code, table.stderr).toBe(0);
    const line = table.stdout.split('\n').find((l) => l.startsWith(runId));
    expect(line).toMatch(/cli-run\s+completed\s+100\.0%\s+240\/240/);

    const detail = await regen(['status', runId]);
    expect(detail.code, detail.stderr).toBe(0);
    expect(detail.stdout).toMatch(new RegExp(`^run\\s+${runId} \\(cli-run\\)$`, 'm'));
    // Each count names its unit: the requests in flight, the samples done.
    expect(detail.stdout).toMatch(/^in flight\s+0 samples$/m);
    expect(detail.stdout).toMatch(/^samples\s+240 completed, 0 failed, 0 claimed ahead, 0 pending$/m);
    expect(detail.stdout).toMatch(/^setup\s+regenerate last_assistant, n 1, split none, format jsonl, card none$/m);
    expect(detail.stdout).toMatch(/shards\s+5 of 5 uploaded/);
    expect(detail.stdout).toMatch(/manifest\s+file:\/\/.*manifest\.json/);
  });

  it('submits an embeddings file with --endpoint, and refuses a route regen does not run', async () => {
    const path = join(files.dir, 'embed.jsonl');
    writeFileSync(path, Array.from({ length: 12 }, (_, i) => JSON.stringify({ id: `e${i}`, input: `text to embed ${i}` })).join('\n') + '\n');
    const res = await regen(['submit', path, '--model', 'sim-model', '--endpoint', '/v1/embeddings', '--format', 'parquet', '--watch']);
    expect(res.code, res.stderr).toBe(0);
    const run = await getRun(res.stdout.trim().split('\n')[0]);
    expect(run).toMatchObject({ status: 'completed', endpoint: '/v1/embeddings', output_format: 'parquet', request_counts: { total: 12, completed: 12 } });

    const refused = await regen(['submit', path, '--model', 'sim-model', '--endpoint', '/v1/responses']);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain('--endpoint');
  });

  it('pauses, resumes and cancels a run', async () => {
    await sim.configure({ ttftMs: 300 });
    const submitted = await regen(['submit', prompts('slow', 3000), '--model', 'sim-model', '--name', 'slow']);
    expect(submitted.code, submitted.stderr).toBe(0);
    const runId = submitted.stdout.trim();
    await waitFor('the run to start', async () => ((await getRun(runId)).status === 'in_progress' ? true : undefined));

    const pause = await regen(['runs', 'pause', runId]);
    expect(pause.code, pause.stderr).toBe(0);
    expect(pause.stdout.trim()).toBe(`${runId}: paused`);
    expect((await getRun(runId)).status).toBe('paused');

    const again = await regen(['runs', 'pause', runId]);
    expect(again.code).toBe(1);
    expect(again.stderr.trim()).toBe('regen: cannot pause a run that is paused');

    const resume = await regen(['runs', 'resume', runId]);
    expect(resume.code, resume.stderr).toBe(0);
    expect(resume.stdout).toMatch(new RegExp(`^${runId}: (queued|in_progress)`));
    await waitFor('the run to go on', async () => ((await getRun(runId)).status === 'in_progress' ? true : undefined));

    const cancel = await regen(['runs', 'cancel', runId]);
    expect(cancel.code, cancel.stderr).toBe(0);
    await waitFor('the run to be cancelled', async () => ((await getRun(runId)).status === 'cancelled' ? true : undefined));
    await sim.configure({ ttftMs: 20 });
  });

  it('exits 3 when the quality gate pauses a watched run, and resumes it with --override-gate', async () => {
    await sim.configure({ degenerateRate: 1 });
    const res = await regen(['submit', prompts('gated', 600), '--model', 'sim-model', '--param', 'chat_template_kwargs.enable_thinking=true', '--watch']);
    await sim.configure({ degenerateRate: 0 });
    expect(res.code, res.stderr).toBe(3);
    const runId = res.stdout.trim();
    expect(res.stderr).toContain('paused by the quality gate');
    expect(res.stderr).toContain(`regen runs resume ${runId} --override-gate`);
    expect((await getRun(runId)).status_reason).toMatch(/^quality gate: /);

    const resume = await regen(['runs', 'resume', runId, '--override-gate']);
    expect(resume.code, resume.stderr).toBe(0);
    expect(resume.stdout).toContain('(quality gate overridden)');
    const watched = await regen(['status', runId, '--watch']);
    expect(watched.code, watched.stderr).toBe(0);
    expect((await getRun(runId)).status).toBe('completed');
  });

  it('refuses whole numbers past what the flag can mean, and shares that are not a number in (0, 1), before any file is uploaded, naming the range', async () => {
    const filesBefore = (await call(server.url, '/v1/files?limit=1000', { headers: auth })).body.data.length;
    const file = prompts('range', 1);
    const results = await Promise.all([
      regen(['plan', file, '--model', 'm', '--endpoints', '99999999999999999999']),
      regen(['plan', file, '--model', 'm', '--endpoints', '100001']),
      regen(['submit', file, '--model', 'm', '--shard-size', '9007199254740993']),
      regen(['demo', '--samples', '0']),
      regen(['submit', file, '--model', 'm', '--eval-share', '0.5x']),
      regen(['submit', file, '--model', 'm', '--eval-share', 'abc']),
      regen(['submit', file, '--model', 'm', '--eval-share', '1']),
    ]);
    const [endpoints, tooMany, shardSize, demo, ...shares] = results;
    for (const r of results) expect(r.code, r.stderr).toBe(2);
    expect(endpoints.stderr).toContain(
      "option '--endpoints <n>' argument '99999999999999999999' is invalid. --endpoints must be a whole number from 1 to 100,000",
    );
    expect(tooMany.stderr).toContain('--endpoints must be a whole number from 1 to 100,000');
    expect(shardSize.stderr).toContain('--shard-size must be a whole number from 1 to 9,007,199,254,740,991');
    expect(demo.stderr).toContain('--samples must be a whole number from 1 to');
    for (const share of shares) expect(share.stderr).toContain('--eval-share must be a number between 0 and 1, such as 0.05');
    expect((await call(server.url, '/v1/files?limit=1000', { headers: auth })).body.data.length).toBe(filesBefore);
  });

  it('explains usage errors in one line with exit code 2, and server refusals with exit code 1', async () => {
    const filesBefore = (await call(server.url, '/v1/files?limit=1000', { headers: auth })).body.data.length;
    const closed = await closedPort();
    // Independent commands, each its own process: run side by side. Only the refused run uploads a
    // file, so the count of files before and after is its alone.
    const [missing, noModel, badParam, refused, badCap, noToken, unknownRun, down] = await Promise.all([
      regen(['submit', join(files.dir, 'nope.jsonl'), '--model', 'm']),
      regen(['submit', prompts('x', 1)]),
      regen(['submit', prompts('y', 1), '--model', 'm', '--param', 'temperature']),
      regen(['submit', prompts('z', 1), '--model', 'm', '--param', 'temperature=9']),
      regen(['endpoints', 'add', 'http://10.0.0.9:30000', '--max-concurrency', 'lots']),
      regen(['status'], { REGEN_TOKEN: '' }),
      regen(['status', 'run_nope']),
      regen(['status', '--server', `http://127.0.0.1:${closed}`]),
    ]);
    expect(missing.code).toBe(2);
    expect(missing.stderr.trim()).toBe(`regen: cannot read ${join(files.dir, 'nope.jsonl')}: no such file`);

    expect(noModel.code).toBe(2);
    expect(noModel.stderr).toContain("required option '--model <model>' not specified");

    expect(badParam.code).toBe(2);
    expect(badParam.stderr).toContain('--param: expected key=value');

    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/^regen: params\.temperature: /m);
    // The upload of a refused run is removed again.
    expect((await call(server.url, '/v1/files?limit=1000', { headers: auth })).body.data.length).toBe(filesBefore);

    expect(badCap.code).toBe(2);

    expect(noToken.code).toBe(1);
    expect(noToken.stderr.trim()).toMatch(/^regen: .*Bearer.*\(set REGEN_TOKEN\)$/);

    expect(unknownRun.code).toBe(1);
    expect(unknownRun.stderr.trim()).toBe('regen: run "run_nope" does not exist');

    expect(down.code).toBe(1);
    expect(down.stderr.trim()).toMatch(new RegExp(`^regen: cannot reach http://127\\.0\\.0\\.1:${closed} \\(ECONNREFUSED\\); is \`regen serve\` running\\?`));
  });
});
