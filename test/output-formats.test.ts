import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DuckDBInstance } from '@duckdb/node-api';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { pickSplit } from '../src/domain/assign.js';
import { readParquetRows } from '../src/storage/parquet.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, startTestServer } from './support/server.js';
import { completedRun, makePrompts, readManifestFiles, registerEndpoint, uploadFile } from './support/runner-checks.js';

// The same input written as JSONL, as Parquet with a split, and as SpecForge's conversations with
// the same split: an independent reader (DuckDB) loads the Parquet, and every format must hold the
// answers the JSONL run holds (one simulator with a fixed seed answers a prompt the same way twice).

const MODEL = 'qwen3-sim';
const SAMPLES = 240;
const SHARD_SIZE = 50;
const EVAL = 0.2;

let server: Awaited<ReturnType<typeof startTestServer>>;
let sim: SimProcess;
const scratch = mkdtempSync(join(tmpdir(), 'regen-formats-'));
const stores = new Stores({ forcePathStyle: false });

beforeAll(async () => {
  sim = await spawnSimulator({ 'ttft-ms': 5, 'tokens-per-second': 5000, model: MODEL, 'max-running': 32, seed: 7 });
  server = await startTestServer();
});

afterAll(async () => {
  await server?.cleanup();
  await sim?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

const finishedRun = (body: Record<string, unknown>) => completedRun(server.url, body);

/** The run's manifest, each file it lists checked against its stored bytes; the files' bytes by key. */
async function readOutput(run: any): Promise<{ manifest: any; files: Map<string, Buffer> }> {
  const { manifest, files } = await readManifestFiles(stores.forUri(run.output_uri));
  // Every object in the output folder is listed (the folder is local in this test).
  if (run.output_uri.startsWith('file://')) {
    const dir = fileURLToPath(run.output_uri);
    const onDisk = (readdirSync(dir, { recursive: true, withFileTypes: true }) as any[])
      .filter((e) => e.isFile() && !e.name.startsWith('.'))
      .map((e) => relative(dir, join(e.parentPath ?? e.path, e.name)))
      .filter((k) => k !== 'manifest.json' && !k.startsWith('.'));
    expect(onDisk.sort()).toEqual([...files.keys()].sort());
  }
  return { manifest, files };
}

const linesOf = (b: Buffer) =>
  b
    .toString('utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));

describe('output formats and the split', () => {
  let jsonl: Map<string, any>;
  let fileId: string;

  it('a JSONL run without a split writes shards at the prefix and no card', async () => {
    await registerEndpoint(server.url, sim.url);
    fileId = await uploadFile(server.url, makePrompts(SAMPLES).jsonl);
    const run = await finishedRun({ model: MODEL, input: { file_id: fileId }, shard_size: SHARD_SIZE, regenerate: 'last_assistant' });
    expect(run.output_format).toBe('jsonl');
    expect(run.split).toBeNull();
    const { manifest, files } = await readOutput(run);
    expect(manifest.card).toBeNull();
    expect([...files.keys()].every((k) => /^shard-\d{5}\.jsonl$/.test(k))).toBe(true);
    jsonl = new Map([...files.values()].flatMap(linesOf).map((l) => [l.custom_id, l]));
    expect(jsonl.size).toBe(SAMPLES);
  });

  let parquetSplit: Map<string, string>;

  it('Parquet with a split: DuckDB reads every shard, the rows equal the JSONL run, and the card names every file', async () => {
    const run = await finishedRun({
      model: MODEL,
      input: { file_id: fileId },
      shard_size: SHARD_SIZE,
      regenerate: 'last_assistant',
      output: { format: 'parquet' },
      split: { eval: EVAL },
    });
    expect(run.output_format).toBe('parquet');
    expect(run.split).toEqual({ eval: EVAL });
    const { manifest, files } = await readOutput(run);
    const shards = manifest.files.filter((f: any) => f.kind === 'parquet');
    expect(shards.length).toBeGreaterThan(0);
    expect(shards.every((f: any) => /^(train|eval)\/shard-\d{5}\.parquet$/.test(f.key))).toBe(true);
    expect(new Set(shards.map((f: any) => f.split))).toEqual(new Set(['train', 'eval']));

    // DuckDB reads local files: the shards as stored, copied out of the store.
    const paths: string[] = shards.map((f: any) => join(scratch, run.id, f.key));
    for (const [i, f] of shards.entries()) {
      mkdirSync(dirname(paths[i]!), { recursive: true });
      writeFileSync(paths[i]!, files.get(f.key)!);
    }
    const duck = await (await DuckDBInstance.create(':memory:')).connect();
    // Each shard alone: its row count is the manifest's, its rows all of its split.
    for (const [i, f] of shards.entries()) {
      const r = await duck.runAndReadAll(`select count(*)::int as n, count(distinct split)::int as s, min(split) as split from read_parquet('${paths[i]}')`);
      expect(r.getRowObjectsJson()[0]).toEqual({ n: f.count, s: 1, split: f.split });
    }
    const all = await duck.runAndReadAll(
      `select custom_id, split, content, reasoning_content, finish_reason, usage.completion_tokens as completion_tokens, messages, flags, attempts, model, variant, sample_index, metadata, turns from read_parquet([${paths.map((p: string) => `'${p}'`).join(',')}])`,
    );
    const rows = all.getRowObjectsJson() as any[];
    expect(rows).toHaveLength(SAMPLES);
    expect(new Set(rows.map((r) => r.custom_id))).toEqual(new Set(jsonl.keys()));
    parquetSplit = new Map(rows.map((r) => [r.custom_id, r.split]));
    for (const r of rows) {
      const l = jsonl.get(r.custom_id);
      expect(r.split).toBe(pickSplit(r.custom_id, EVAL));
      expect(r.content).toBe(l.content);
      expect(r.reasoning_content).toBe(l.reasoning_content);
      expect(r.finish_reason).toBe(l.finish_reason);
      expect(r.completion_tokens).toBe(l.usage.completion_tokens);
      expect(r.messages).toEqual(
        l.messages.map((m: any) => ({ role: m.role, content: m.content, reasoning_content: null, tool_calls: null, tool_call_id: null })),
      );
      expect(r.flags).toEqual(l.flags);
      expect(r.model).toBe(l.model);
      // Every line has its sample_index (0 here: one answer a prompt); the rest are absent from these lines.
      expect([r.variant, r.sample_index, r.metadata, r.turns]).toEqual([null, 0, null, null]);
    }

    // The card: YAML front matter that names every shard under its split, with the columns DuckDB saw.
    expect(manifest.card).toBe('README.md');
    const card = files.get('README.md')!.toString('utf8');
    const front = parseYaml(card.split('---\n')[1]!);
    const dataFiles = front.configs[0].data_files as { split: string; path: string[] }[];
    expect(dataFiles.map((d) => d.split)).toEqual(['train', 'eval']);
    for (const d of dataFiles)
      expect(d.path.sort()).toEqual(
        shards
          .filter((f: any) => f.split === d.split)
          .map((f: any) => f.key)
          .sort(),
      );
    const described = (await duck.runAndReadAll(`describe select * from read_parquet('${paths[0]}')`)).getRowObjectsJson().map((c: any) => c.column_name);
    expect(front.dataset_info.features.map((f: any) => f.name)).toEqual(described);
    const bySplit = Object.fromEntries(front.dataset_info.splits.map((s: any) => [s.name, s.num_examples]));
    expect(bySplit.eval).toBe(rows.filter((r) => r.split === 'eval').length);
    expect(bySplit.train + bySplit.eval).toBe(SAMPLES);
    expect(card).toContain(MODEL);
    // The status the run ends with, not the `finalizing` it is in while the card is written.
    expect(card).toContain(`(run \`${run.id}\`, created ${run.created_at}, completed)`);

    // The sample route reads an answer back out of a Parquet shard.
    const id = rows[rows.length - 1].custom_id;
    const sample = await call(server.url, `/v1/runs/${run.id}/samples/${encodeURIComponent(id)}`);
    expect(sample.status).toBe(200);
    expect(sample.body.output).toEqual({ content: jsonl.get(id).content, reasoning_content: jsonl.get(id).reasoning_content });
    duck.closeSync();
  });

  it("conversations with the same split: SpecForge's shape, the JSONL run's answers, each id in the same split as the other run", async () => {
    const run = await finishedRun({
      model: MODEL,
      input: { file_id: fileId },
      shard_size: SHARD_SIZE,
      regenerate: 'last_assistant',
      output: { format: 'conversations' },
      split: { eval: EVAL },
    });
    const { manifest, files } = await readOutput(run);
    expect(manifest.format).toBe('conversations');
    const seen = new Set<string>();
    for (const f of manifest.files.filter((x: any) => x.kind === 'jsonl')) {
      expect(f.key).toMatch(/^(train|eval)\/shard-\d{5}\.jsonl$/);
      const lines = linesOf(files.get(f.key)!);
      expect(lines).toHaveLength(f.count);
      for (const line of lines) {
        expect(Object.keys(line).sort()).toEqual(['conversations', 'id', 'status']);
        expect(line.status).toBe('success');
        const l = jsonl.get(line.id);
        expect(line.conversations).toEqual([
          ...l.messages.map((m: any) => ({ role: m.role, content: m.content })),
          { role: 'assistant', content: l.content, reasoning_content: l.reasoning_content },
        ]);
        expect(f.split).toBe(parquetSplit.get(line.id));
        seen.add(line.id);
      }
    }
    expect(seen.size).toBe(SAMPLES);
    const front = parseYaml(files.get('README.md')!.toString('utf8').split('---\n')[1]!);
    expect(front.configs[0].data_files.flatMap((d: any) => d.path).sort()).toEqual(
      manifest.files
        .filter((x: any) => x.kind === 'jsonl')
        .map((x: any) => x.key)
        .sort(),
    );
    const id = [...seen][0]!;
    const sample = await call(server.url, `/v1/runs/${run.id}/samples/${encodeURIComponent(id)}`);
    expect(sample.body.output).toEqual({ content: jsonl.get(id).content, reasoning_content: jsonl.get(id).reasoning_content });
  });

  it('a split run whose input repeats ids: each split fills its own shards with the samples inserted, and every shard is written', async () => {
    const requests = Array.from({ length: 60 }, (_, i) => ({ custom_id: `d-${i % 50}`, messages: [{ role: 'user', content: `question ${i % 50}` }] }));
    const run = await finishedRun({ model: MODEL, input: { requests }, shard_size: 4, on_invalid_line: 'skip', split: { eval: 0.3 } });
    expect(run.request_counts.total).toBe(50);
    expect(run.shards.uploaded).toBe(run.shards.total);
    const { manifest, files } = await readOutput(run);
    expect(manifest.card).toBe('README.md');
    const shards = manifest.files.filter((f: any) => f.kind === 'jsonl');
    const ids = new Map<string, string>();
    for (const f of shards) {
      expect(f.key.startsWith(`${f.split}/shard-`)).toBe(true);
      const lines = linesOf(files.get(f.key)!);
      expect(lines.length).toBeLessThanOrEqual(4);
      for (const l of lines) ids.set(l.custom_id, f.split);
    }
    expect(ids.size).toBe(50);
    for (const [id, split] of ids) expect(split).toBe(pickSplit(id, 0.3));
    // Each split's shards are numbered from 0 without gaps.
    for (const split of ['train', 'eval']) {
      const mine = shards.filter((f: any) => f.split === split).map((f: any) => f.key);
      expect(mine).toEqual(mine.map((_: string, i: number) => `${split}/shard-${String(i).padStart(5, '0')}.jsonl`));
    }
  });

  it('refuses an unknown format and a split share out of range or missing, naming the field', async () => {
    const bad = await call(server.url, '/v1/runs', {
      method: 'POST',
      json: { model: MODEL, input: { file_id: fileId }, output: { format: 'csv' } },
    });
    expect(bad.status).toBe(422);
    expect(JSON.stringify(bad.body)).toContain('output.format');
    const share = await call(server.url, '/v1/runs', { method: 'POST', json: { model: MODEL, input: { file_id: fileId }, split: { eval: 1.5 } } });
    expect(share.status).toBe(422);
    expect(JSON.stringify(share.body)).toContain('split.eval');
    // A split without its share says the share is missing, in those words.
    const empty = await call(server.url, '/v1/runs', { method: 'POST', json: { model: MODEL, input: { file_id: fileId }, split: {} } });
    expect(empty.status).toBe(422);
    expect(empty.body.errors).toContainEqual({ field: 'split.eval', message: 'required, a number' });
  });
});

describe('ids and metadata exactly as the input wrote them', () => {
  // Numbers JSON.parse changes: past 2^53, -0, 1e400 (Infinity), 1.0, 1e21 (written back 1e+21); and a `__proto__` key.
  const EXACT_META = '"big":9007199254740993,"neg":-0,"huge":1e400,"f":1.0,"__proto__":{"x":1},"nested":{"a":[1e21, 2]}';
  const input = [
    `{"id":9007199254740993,"prompt":"one",${EXACT_META}}`,
    '{"id":9007199254740992,"prompt":"two"}',
    '{"id":-0,"prompt":"three"}',
    '{"id":0,"prompt":"four"}',
    '{"id":1e21,"prompt":"five","__proto__":"own"}',
    '{"id":7,"prompt":"six","source":"s","meta":{"k":[1,2]}}',
  ];
  const ids = ['9007199254740993', '9007199254740992', '-0', '0', '1e21', '7'];
  let fileId: string;

  /** A SpecForge line's `id` as written (a number's literal, which parsing would change), after the input's own fields. */
  const idLiteral = (line: string) => {
    const text = /(?:^\{|,)"id":("(?:[^"\\]|\\.)*"|[^,}]+)/.exec(line)![1];
    return text.startsWith('"') ? (JSON.parse(text) as string) : text;
  };

  /** Each completed record's custom_id and the text of its metadata, from the shards of a finished run. */
  async function records(format: string): Promise<{ raw: Map<string, string>; run: any }> {
    fileId ??= await uploadFile(server.url, input.join('\n') + '\n');
    const run = await finishedRun({ model: MODEL, input: { file_id: fileId }, output: { format } });
    expect(run.invalid_lines.count).toBe(0);
    expect(run.request_counts.total).toBe(ids.length);
    const { files } = await readOutput(run);
    const raw = new Map<string, string>();
    for (const [key, bytes] of files) {
      if (key.endsWith('.parquet')) {
        for (const row of await readParquetRows(bytes)) raw.set(row.custom_id as string, (row.metadata as string | null) ?? '');
      } else if (/shard-\d{5}\.jsonl$/.test(key)) {
        for (const line of bytes.toString('utf8').split('\n').filter(Boolean))
          raw.set(format === 'conversations' ? idLiteral(line) : JSON.parse(line).custom_id, line);
      }
    }
    expect([...raw.keys()].sort()).toEqual([...ids].sort());
    return { raw, run };
  }

  it('JSONL: a numeric id is its literal, and metadata is each field’s own JSON text', async () => {
    await registerEndpoint(server.url, sim.url);
    const { raw, run } = await records('jsonl');
    expect(raw.get('9007199254740993')).toContain(`"metadata":{${EXACT_META}}`);
    expect(raw.get('1e21')).toContain('"metadata":{"__proto__":"own"}');
    expect(JSON.parse(raw.get('7')!).metadata).toEqual({ source: 's', meta: { k: [1, 2] } });
    expect(JSON.parse(raw.get('-0')!)).not.toHaveProperty('metadata');
    // The sample route finds each by its own id.
    for (const id of ['-0', '0', '9007199254740992']) {
      const sample = await call(server.url, `/v1/runs/${run.id}/samples/${encodeURIComponent(id)}`);
      expect(sample.status).toBe(200);
      expect(sample.body.custom_id).toBe(id);
    }
  });

  it('conversations: the line is the input object, its fields and its numeric id as written', async () => {
    const { raw } = await records('conversations');
    expect(raw.get('9007199254740993')).toContain(`{${EXACT_META},"id":9007199254740993,`);
    expect(raw.get('1e21')).toMatch(/^\{"__proto__":"own","id":1e21,/);
    expect(raw.get('-0')).toMatch(/^\{"id":-0,/);
  });

  it('Parquet: the metadata column holds the fields’ own JSON text', async () => {
    const { raw } = await records('parquet');
    expect(raw.get('9007199254740993')).toBe(`{${EXACT_META}}`);
    expect(raw.get('1e21')).toBe('{"__proto__":"own"}');
    expect(raw.get('7')).toBe('{"source":"s","meta":{"k":[1,2]}}');
    expect(raw.get('0')).toBe('');
  });
});
