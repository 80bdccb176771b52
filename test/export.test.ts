import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DuckDBInstance, type DuckDBConnection } from '@duckdb/node-api';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, REGEN, startTestServer, tempDir } from './support/server.js';
import { completedRun, createRun, makePrompts, readManifestFiles, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// `regen export` and GET /v1/runs/{id}/export end to end: regen as a server, the simulator as its own
// process, the exported file read back by DuckDB (an independent Parquet reader) and compared with
// the run's own shards; a shard changed on disk stops the export, and a run still under way is refused.

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const MODEL = 'export-sim';
// Answers only after two minutes: a run sent to it is still in progress whenever the test looks.
const STALLED = 'export-stalled-sim';
const SAMPLES = 120;
const SHARD_SIZE = 20;
const VARIANTS = [
  { name: 'think', weight: 2, params: { chat_template_kwargs: { enable_thinking: true } } },
  { name: 'plain', weight: 1, params: { chat_template_kwargs: { enable_thinking: false } } },
];

let server: Awaited<ReturnType<typeof startTestServer>>;
const sims: SimProcess[] = [];
const stores = new Stores({ forcePathStyle: false });
const scratch = tempDir('regen-export-');
let duck: DuckDBConnection;
let fileId: string;

beforeAll(async () => {
  sims.push(await spawnSimulator({ 'ttft-ms': 5, 'tokens-per-second': 5000, model: MODEL, 'max-running': 32, seed: 3 }));
  sims.push(await spawnSimulator({ 'ttft-ms': 120_000, model: STALLED, 'max-running': 4 }));
  server = await startTestServer();
  for (const s of sims) await registerEndpoint(server.url, s.url);
  fileId = await uploadFile(server.url, makePrompts(SAMPLES).jsonl);
  duck = await (await DuckDBInstance.create(':memory:')).connect();
});

afterAll(async () => {
  duck?.closeSync();
  await server?.cleanup();
  stores.close();
  await Promise.all(sims.map((s) => s.stop()));
  scratch.cleanup();
});

interface Result {
  code: number | null;
  stdout: Buffer;
  stderr: string;
}

/** `regen ...args` as a user runs it, against the test server. */
async function regen(args: string[]): Promise<Result> {
  const child = spawn(process.execPath, [...REGEN, ...args], { cwd: ROOT, env: { ...process.env, REGEN_URL: server.url }, stdio: ['ignore', 'pipe', 'pipe'] });
  const stdout: Buffer[] = [];
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => stdout.push(d));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const timer = setTimeout(() => child.kill('SIGKILL'), 90_000);
  const [code] = (await once(child, 'exit')) as [number | null];
  clearTimeout(timer);
  return { code, stdout: Buffer.concat(stdout), stderr };
}

/** Every column of a Parquet file (or files), as DuckDB reads them, ordered by custom_id. */
async function parquetRows(paths: string[]): Promise<any[]> {
  const r = await duck.runAndReadAll(`select * from read_parquet([${paths.map((p) => `'${p}'`).join(',')}]) order by custom_id`);
  return r.getRowObjectsJson() as any[];
}

/** Bytes written to a file of their own under the scratch folder, for DuckDB to read. */
function saved(name: string, bytes: Buffer): string {
  const path = join(scratch.dir, name);
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, bytes);
  return path;
}

const jsonLines = (b: Buffer): any[] =>
  b
    .toString('utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));

const exportOf = (run: any, query = '') => fetch(`${server.url}/v1/runs/${run.id}/export${query}`);

describe('export of a split Parquet run with variants', () => {
  let run: any;
  /** The run's rows as its shards hold them, by split. */
  let rows: any[];

  beforeAll(async () => {
    run = await completedRun(server.url, {
      model: MODEL,
      input: { file_id: fileId },
      shard_size: SHARD_SIZE,
      output: { format: 'parquet' },
      split: { eval: 0.25 },
      variants: VARIANTS,
    });
    const { manifest, files } = await readManifestFiles(stores.forUri(run.output_uri));
    const shards = manifest.shards.filter((s: any) => s.key);
    expect(new Set(shards.map((s: any) => s.split))).toEqual(new Set(['train', 'eval']));
    rows = await parquetRows(shards.map((s: any) => saved(`${run.id}/${s.key}`, files.get(s.key)!)));
    expect(rows).toHaveLength(SAMPLES);
    expect(new Set(rows.map((r) => r.variant))).toEqual(new Set(['think', 'plain']));
  });

  it('over HTTP: one Parquet file that DuckDB reads as the run rows, every column', async () => {
    const res = await exportOf(run);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/vnd.apache.parquet');
    expect(res.headers.get('content-disposition')).toBe(`attachment; filename="${run.id}.parquet"`);
    const path = saved('http-all.parquet', Buffer.from(await res.arrayBuffer()));
    expect(await parquetRows([path])).toEqual(rows);
  });

  it('`regen export --split train -o FILE`: the train rows only, and the file is whole or absent', async () => {
    const out = join(scratch.dir, 'cli', 'train.parquet');
    mkdirSync(dirname(out), { recursive: true });
    const res = await regen(['export', run.id, '--split', 'train', '-o', out]);
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout.toString()).toMatch(new RegExp(`^${out.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: [\\d,]+ bytes \\(${run.id}\\)\\n$`));
    const train = rows.filter((r) => r.split === 'train');
    expect(train.length).toBeGreaterThan(0);
    expect(train.length).toBeLessThan(SAMPLES);
    expect(await parquetRows([out])).toEqual(train);
    // Only the file: the temp file it was written as is gone.
    expect(readdirSync(dirname(out))).toEqual(['train.parquet']);
  });

  it('a variant filter, over HTTP and through the CLI (as JSONL, to stdout)', async () => {
    const res = await exportOf(run, '?variant=plain&split=eval');
    expect(res.status).toBe(200);
    const plainEval = rows.filter((r) => r.variant === 'plain' && r.split === 'eval');
    expect(plainEval.length).toBeGreaterThan(0);
    expect(await parquetRows([saved('http-plain-eval.parquet', Buffer.from(await res.arrayBuffer()))])).toEqual(plainEval);

    const cli = await regen(['export', run.id, '--variant', 'think', '--format', 'jsonl']);
    expect(cli.code, cli.stderr).toBe(0);
    const lines = jsonLines(cli.stdout);
    const think = rows.filter((r) => r.variant === 'think');
    expect(lines.map((l) => l.custom_id).sort()).toEqual(think.map((r) => r.custom_id));
    const byId = new Map(think.map((r) => [r.custom_id, r]));
    for (const l of lines) {
      const r = byId.get(l.custom_id);
      expect([l.variant, l.split, l.content, l.reasoning_content, l.usage, l.flags, l.messages]).toEqual([
        'think',
        r.split,
        r.content,
        r.reasoning_content,
        r.usage,
        r.flags,
        r.messages,
      ]);
    }
  });

  it('bad parameters are refused naming them, over HTTP and through the CLI', async () => {
    for (const [query, field] of [
      ['?split=test', 'split'],
      ['?format=csv', 'format'],
      ['?variant=nope', 'variant'],
      ['?variant=no%20such', 'variant'],
      ['?splt=train', 'splt'],
    ]) {
      const res = await call(server.url, `/v1/runs/${run.id}/export${query}`);
      expect(res.status, query).toBe(422);
      expect(res.headers.get('content-type')).toContain('application/problem+json');
      expect(res.body.field, query).toBe(field);
    }
    expect((await call(server.url, `/v1/runs/${run.id}/export?variant=nope`)).body.detail).toBe(
      'variant: the run has no variant "nope"; its variants are think, plain',
    );
    expect((await call(server.url, '/v1/runs/run_nosuchrun/export')).status).toBe(404);

    const cli = await regen(['export', run.id, '--variant', 'nope']);
    expect(cli.code).toBe(2);
    expect(cli.stderr).toContain('variant: the run has no variant "nope"');
    expect(cli.stdout.length).toBe(0);
    const split = await regen(['export', run.id, '--split', 'test']);
    expect(split.code).toBe(2);
    expect(split.stderr).toContain('--split');
    // -o names a file: a folder is refused before anything is asked, and nothing is left in it.
    const folder = await regen(['export', run.id, '-o', scratch.dir]);
    expect(folder.code).toBe(2);
    expect(folder.stderr).toContain(`-o: ${scratch.dir} is a folder`);
    expect(readdirSync(scratch.dir).filter((f) => f.endsWith('.tmp'))).toEqual([]);
  });
});

describe('export of a JSONL run', () => {
  let run: any;
  let store: ReturnType<Stores['forUri']>;
  let shards: { key: string; bytes: Buffer }[];

  beforeAll(async () => {
    run = await completedRun(server.url, { model: MODEL, input: { file_id: fileId }, shard_size: SHARD_SIZE, regenerate: 'last_assistant' });
    store = stores.forUri(run.output_uri);
    const { manifest, files } = await readManifestFiles(store);
    shards = manifest.shards.filter((s: any) => s.key).map((s: any) => ({ key: s.key, bytes: files.get(s.key)! }));
    expect(shards.length).toBe(SAMPLES / SHARD_SIZE);
  });

  it('is the shards concatenated, byte for byte; as Parquet, the same lines as rows', async () => {
    const res = await exportOf(run);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/jsonl');
    expect(Buffer.from(await res.arrayBuffer()).equals(Buffer.concat(shards.map((s) => s.bytes)))).toBe(true);

    const lines = shards.flatMap((s) => jsonLines(s.bytes)).sort((a, b) => (a.custom_id < b.custom_id ? -1 : 1));
    const parquet = await exportOf(run, '?format=parquet');
    expect(parquet.status).toBe(200);
    const rows = await parquetRows([saved('jsonl-as.parquet', Buffer.from(await parquet.arrayBuffer()))]);
    expect(rows.map((r) => [r.custom_id, r.content, r.reasoning_content, r.finish_reason, r.usage, r.flags, r.split, r.model])).toEqual(
      lines.map((l) => [l.custom_id, l.content, l.reasoning_content, l.finish_reason, l.usage, l.flags, null, l.model]),
    );
    expect(rows.map((r) => r.messages.map((m: any) => [m.role, m.content]))).toEqual(lines.map((l) => l.messages.map((m: any) => [m.role, m.content])));
  });

  it('a split asked of a run without one is refused naming it', async () => {
    const res = await call(server.url, `/v1/runs/${run.id}/export?split=train`);
    expect(res.status).toBe(422);
    expect(res.body.field).toBe('split');
  });

  it('a shard changed on disk stops the export naming it: before the answer for the first, by cutting it off for a later one', async () => {
    const path = (key: string) => join(fileURLToPath(run.output_uri), key);
    const flip = (key: string) => {
      const bytes = readFileSync(path(key));
      bytes[10] ^= 1;
      writeFileSync(path(key), bytes);
    };
    const [first, , third] = shards;

    flip(first!.key);
    const refused = await call(server.url, `/v1/runs/${run.id}/export`);
    expect(refused.status).toBe(409);
    expect(refused.body.detail).toContain(`shard ${first!.key} does not match the manifest's sha256`);
    const out = join(scratch.dir, 'corrupt', 'run.jsonl');
    mkdirSync(dirname(out), { recursive: true });
    const cli = await regen(['export', run.id, '-o', out]);
    expect(cli.code).toBe(1);
    expect(cli.stderr).toContain(`shard ${first!.key} does not match the manifest's sha256`);
    expect(readdirSync(dirname(out))).toEqual([]);
    flip(first!.key);

    flip(third!.key);
    const cut = await exportOf(run);
    expect(cut.status).toBe(200);
    // The body ends in an error, not a clean end a reader could take for the whole file.
    await expect(cut.arrayBuffer()).rejects.toThrow();
    const cliCut = await regen(['export', run.id, '-o', out]);
    expect(cliCut.code).toBe(1);
    expect(cliCut.stderr).toContain(`the export of ${run.id} broke off after`);
    expect(cliCut.stderr).toContain(`${out} was not written`);
    expect(readdirSync(dirname(out))).toEqual([]);
    flip(third!.key);
    expect((await exportOf(run)).status).toBe(200);
  });
});

it('a run still under way is refused with 409', async () => {
  const created = await createRun(server.url, { model: STALLED, input: { requests: [{ custom_id: 'a', messages: [{ role: 'user', content: 'hi' }] }] } });
  await waitForStatus(server.url, created.id, ['in_progress']);
  const res = await call(server.url, `/v1/runs/${created.id}/export`);
  expect(res.status).toBe(409);
  expect(res.headers.get('content-type')).toContain('application/problem+json');
  expect(res.body.detail).toBe('the run is in_progress (0 of 1 shards written): a run can be exported once it has ended with its shards written');
  const cli = await regen(['export', created.id]);
  expect(cli.code).toBe(1);
  expect(cli.stderr).toContain('the run is in_progress');
  expect((await call(server.url, `/v1/runs/${created.id}/cancel`, { method: 'POST' })).status).toBe(200);
});
