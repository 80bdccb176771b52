import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { DuckDBInstance } from '@duckdb/node-api';
import { afterAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { closeDb, openDb } from '../../src/db/client.js';
import { getRun } from '../../src/db/runs.js';
import { listRunShards } from '../../src/db/shards.js';
import type { RunnerDeps } from '../../src/deps.js';
import { pickSplit } from '../../src/domain/assign.js';
import { datasetCard } from '../../src/domain/dataset-card.js';
import { stringifyExact } from '../../src/domain/exact-json.js';
import {
  answerOfRecord,
  conversationsLine,
  type LineFields,
  parquetRow,
  parseStoredLine,
  shardErrorsObjectKey,
  shardObjectKey,
  splitShardIdx,
} from '../../src/domain/output-format.js';
import { uploadShard } from '../../src/runner/shard-writer.js';
import { Stores } from '../../src/storage/index.js';
import { encodeParquet, parquetRowCount } from '../../src/storage/parquet.js';
import { tempDir } from '../support/server.js';

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const line = (over: Partial<LineFields> = {}): LineFields => ({
  custom_id: 'a',
  messages: [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: [{ type: 'text', text: 'héllo 🌍' }] },
  ],
  content: 'Answer ✓',
  reasoning_content: 'thought',
  finish_reason: 'stop',
  usage: { prompt_tokens: 12, completion_tokens: 34, reasoning_tokens: 5, cached_tokens: 0 },
  model: 'm',
  endpoint_id: 'ep_1',
  latency_ms: 1500,
  attempts: 1,
  flags: [],
  ...over,
});

async function duckRows(file: string, sql: string): Promise<any[]> {
  const c = await (await DuckDBInstance.create(':memory:')).connect();
  try {
    return (await c.runAndReadAll(sql.replace('$F', `read_parquet('${file}')`))).getRowObjectsJson() as any[];
  } finally {
    c.closeSync();
  }
}

describe('the split', () => {
  it('puts a stable 5% of 2,000 ids in eval, within 2 points', () => {
    const ids = Array.from({ length: 2000 }, (_, i) => `row-${i}`);
    const evals = ids.filter((id) => pickSplit(id, 0.05) === 'eval');
    expect(Math.abs(evals.length / ids.length - 0.05)).toBeLessThan(0.02);
    expect(ids.filter((id) => pickSplit(id, 0.05) === 'eval')).toEqual(evals);
  });

  it('numbers each split its own shards, under its folder', () => {
    expect(shardObjectKey({ idx: 3, split: null }, 'jsonl')).toBe('shard-00003.jsonl');
    expect(shardObjectKey({ idx: splitShardIdx('train', 2), split: 'train' }, 'parquet')).toBe('train/shard-00002.parquet');
    expect(shardObjectKey({ idx: splitShardIdx('eval', 0), split: 'eval' }, 'conversations')).toBe('eval/shard-00000.jsonl');
    expect(shardErrorsObjectKey({ idx: splitShardIdx('eval', 4), split: 'eval' })).toBe('eval/shard-00004.errors.jsonl');
    expect(splitShardIdx('train', 1)).not.toBe(splitShardIdx('eval', 1));
  });
});

describe('conversations', () => {
  it("keeps regen's own sample_index and variant over input fields of the same name", () => {
    const fedBack = conversationsLine(line({ metadata: { sample_index: 2, variant: 'old' }, sample_index: 0, variant: null }));
    expect(fedBack.sample_index).toBe(0);
    expect(fedBack).not.toHaveProperty('variant');
    expect(conversationsLine(line({ metadata: { source: 's' }, sample_index: 0 }))).not.toHaveProperty('sample_index');
    expect(conversationsLine(line({ metadata: { sample_index: 0 }, sample_index: 3, variant: 'think' }))).toMatchObject({ sample_index: 3, variant: 'think' });
  });

  it("is SpecForge's regenerated line: the input's fields, the conversation with the answer and its reasoning, a status", () => {
    const out = conversationsLine(line({ metadata: { source: 'sharegpt', id: 'not-this' }, variant: 'think' }));
    expect(out).toEqual({
      source: 'sharegpt',
      id: 'a',
      variant: 'think',
      conversations: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: [{ type: 'text', text: 'héllo 🌍' }] },
        { role: 'assistant', content: 'Answer ✓', reasoning_content: 'thought' },
      ],
      status: 'success',
    });
  });

  it('writes a cut or empty answer as status "error" with its flags, and a numeric id as a number', () => {
    for (const flags of [['truncated'], ['empty_content', 'truncated'], ['repetitive']]) {
      const out = conversationsLine(line({ flags, content: '' }));
      expect(out).toMatchObject({ status: 'error', flags });
    }
    // A flag that does not make the answer unfit keeps the line a success, without flags; an input's own `flags` field does not stand.
    expect(conversationsLine(line({ flags: ['too_short'], metadata: { flags: 'x' } }))).not.toHaveProperty('flags');
    expect(stringifyExact(conversationsLine(line({ custom_id: '9007199254740993' }), true))).toContain('"id":9007199254740993,');
    expect(stringifyExact(conversationsLine(line({ custom_id: '42' })))).toContain('"id":"42",');
  });

  it('takes a conversation regenerated turn by turn as it is, and leaves reasoning out of an answer without any', () => {
    const regenerated = [
      { role: 'user', content: 'q1' },
      { role: 'assistant', content: 'a1', reasoning_content: 'r1' },
      { role: 'user', content: 'q2' },
      { role: 'assistant', content: 'a2', reasoning_content: null },
    ];
    expect(conversationsLine(line({ messages: regenerated, turns: [{}, {}], content: 'a2', reasoning_content: null })).conversations).toEqual([
      { role: 'user', content: 'q1' },
      { role: 'assistant', content: 'a1', reasoning_content: 'r1' },
      { role: 'user', content: 'q2' },
      { role: 'assistant', content: 'a2' },
    ]);
  });
});

describe('tool calls in the output formats', () => {
  const calls = [
    { id: 'call_1', type: 'function', function: { name: 'search', arguments: '{"q": "x"}' } },
    { id: 'call_2', type: 'function', function: { name: 'calc', arguments: '{}' } },
  ];
  const tools = [{ type: 'function', function: { name: 'search' } }];
  const agentic = [
    { role: 'user', content: 'q' },
    { role: 'assistant', content: null, reasoning_content: 'r', tool_calls: calls },
    { role: 'tool', content: 'found', tool_call_id: 'call_1' },
    { role: 'tool', content: '4', tool_call_id: 'call_2' },
    { role: 'assistant', content: 'done', reasoning_content: 'r2' },
  ];

  it("keeps a step's calls and a result's id in SpecForge's conversations, the line's tools at the top", () => {
    const out = conversationsLine(line({ messages: agentic, turns: [{}, {}], content: 'done', tools }));
    expect(out.tools).toEqual(tools);
    expect(out.conversations).toEqual(agentic);
    // A plain answer's calls go on its answer.
    const plain = conversationsLine(line({ content: null, reasoning_content: null, tool_calls: calls }));
    expect((plain.conversations as any[]).at(-1)).toEqual({ role: 'assistant', content: null, tool_calls: calls });
  });

  it('writes Parquet tool_calls as lists of structs, tool_call_id on tool messages and the tools as JSON text', async () => {
    const rows = [parquetRow(line({ messages: agentic, turns: [{}, {}], tools }), null), parquetRow(line({ custom_id: 'b', tool_calls: calls }), null)];
    const file = join(tmp.dir, 'tools.parquet');
    writeFileSync(file, encodeParquet(rows));
    const got = await duckRows(file, 'select * from $F order by custom_id');
    const struct = (c: (typeof calls)[number]) => ({ id: c.id, type: 'function', name: c.function.name, arguments: c.function.arguments });
    expect(got[0].messages[1]).toMatchObject({ role: 'assistant', content: null, tool_calls: calls.map(struct), tool_call_id: null });
    expect(got[0].messages[2]).toMatchObject({ role: 'tool', content: 'found', tool_calls: null, tool_call_id: 'call_1' });
    expect(JSON.parse(got[0].tools)).toEqual(tools);
    expect(got[0].tool_calls).toBeNull();
    expect(got[1].tool_calls).toEqual(calls.map(struct));
    expect(got[1].tools).toBeNull();
  });
});

describe('Parquet rows', () => {
  it('read back by DuckDB with their types: parts as JSON text, nulls, unicode, lists and the usage struct', async () => {
    const rows = [
      parquetRow(line(), 'train'),
      parquetRow(
        line({ custom_id: 'b', content: null, reasoning_content: null, flags: ['truncated', 'too_short'], latency_ms: null, endpoint_id: null }),
        null,
      ),
      parquetRow(line({ custom_id: 'c', variant: 'plain', sample_index: 2, metadata: { k: [1, 2] }, turns: [{ finish_reason: 'stop' }] }), 'eval'),
    ];
    const body = encodeParquet(rows);
    expect(parquetRowCount(body)).toBe(3);
    const file = join(tmp.dir, 'rows.parquet');
    writeFileSync(file, body);
    const got = await duckRows(file, 'select * from $F order by custom_id');
    expect(got[0]).toMatchObject({
      custom_id: 'a',
      messages: [
        { role: 'system', content: 'Be brief.', reasoning_content: null },
        { role: 'user', content: JSON.stringify([{ type: 'text', text: 'héllo 🌍' }]), reasoning_content: null },
      ],
      content: 'Answer ✓',
      usage: { prompt_tokens: 12, completion_tokens: 34, reasoning_tokens: 5, cached_tokens: 0 },
      flags: [],
      split: 'train',
      variant: null,
      sample_index: null,
      latency_ms: 1500,
    });
    expect(got[1]).toMatchObject({
      content: null,
      reasoning_content: null,
      flags: ['truncated', 'too_short'],
      latency_ms: null,
      endpoint_id: null,
      split: null,
    });
    expect(got[2]).toMatchObject({ variant: 'plain', sample_index: 2, metadata: '{"k":[1,2]}', turns: '[{"finish_reason":"stop"}]', split: 'eval' });
    const types = Object.fromEntries((await duckRows(file, 'describe select * from $F')).map((c) => [c.column_name, c.column_type]));
    expect(types).toMatchObject({
      messages:
        'STRUCT("role" VARCHAR, "content" VARCHAR, reasoning_content VARCHAR, tool_calls STRUCT(id VARCHAR, "type" VARCHAR, "name" VARCHAR, arguments VARCHAR)[], tool_call_id VARCHAR)[]',
      flags: 'VARCHAR[]',
      attempts: 'INTEGER',
    });
  });

  it('a shard reopened after its upload keeps the rows staging no longer holds, from the Parquet written before', async () => {
    const db = await openDb(join(tmp.dir, 'reopen.db'));
    const out = join(tmp.dir, 'out');
    mkdirSync(out);
    const stores = new Stores({ forcePathStyle: false });
    const exec = (text: string, params: unknown[] = []) => db.write((w) => w.exec(text, params));
    const staged = (content: string) => JSON.stringify({ content, reasoning_content: null, model: 'm' });
    try {
      await exec(
        `insert into runs (id, model, status, created_at, params, input, shard_size, output_uri, metadata, on_invalid_line, request_timeout_ms, max_attempts, updated_at, total, completed, shards_total, output_format)
         values ('run_p', 'm', 'in_progress', 1, '{}', '{"requests":1}', 2, ?, '{}', 'fail', 1000, 5, 1, 2, 2, 1, 'parquet')`,
        [`${pathToFileURL(out).href}/`],
      );
      await exec(`insert into shards (run_id, idx, first_seq, sample_count, terminal_count) values ('run_p', 0, 0, 2, 2)`);
      for (let i = 0; i < 2; i++) {
        await exec(
          `insert into samples (run_id, seq, shard_idx, custom_id, request, status) values ('run_p', ?, 0, ?, '{"messages":[{"role":"user","content":"q"}]}', 'completed')`,
          [i, `s${i}`],
        );
        await exec(`insert into staging (sample_id, run_id, shard_idx, output) values (?, 'run_p', 0, ?)`, [i + 1, staged(`first ${i}`)]);
      }
      const deps = { db, clock: () => 2, stores } as unknown as RunnerDeps;
      const run = (await getRun(db, 'run_p'))!;
      expect(await uploadShard(deps, run, (await listRunShards(db, 'run_p'))[0]!)).toBe(true);
      // A retry answers s1 again: the shard reopens with s1's new output staged, s0's only in the Parquet.
      await exec(`update shards set status = 'open', generation = generation + 1 where run_id = 'run_p'`);
      await exec(`insert into staging (sample_id, run_id, shard_idx, output) values (2, 'run_p', 0, ?)`, [staged('second 1')]);
      expect(await uploadShard(deps, run, (await listRunShards(db, 'run_p'))[0]!)).toBe(true);
      const [shard] = await listRunShards(db, 'run_p');
      expect(shard).toMatchObject({ key: 'shard-00000.parquet', lines: 2, status: 'uploaded' });
      const rows = await duckRows(join(out, 'shard-00000.parquet'), 'select custom_id, content, messages from $F order by custom_id');
      expect(rows).toEqual([
        { custom_id: 's0', content: 'first 0', messages: [{ role: 'user', content: 'q', reasoning_content: null, tool_calls: null, tool_call_id: null }] },
        { custom_id: 's1', content: 'second 1', messages: [{ role: 'user', content: 'q', reasoning_content: null, tool_calls: null, tool_call_id: null }] },
      ]);
    } finally {
      stores.close();
      await closeDb(db);
    }
  });
});

describe('the dataset card', () => {
  it('front matter `datasets` reads: every shard under its split, the features; then model, variants, counts and quality', () => {
    const card = datasetCard(
      {
        id: 'run_x',
        name: 'demo: "quoted" name',
        model: 'org/model',
        params: { temperature: 0.6 },
        createdAt: 0,
        status: 'completed',
        regenerate: 'last_assistant',
        format: 'parquet',
        evalShare: 0.05,
        variants: [
          { name: 'think', weight: 3, params: { chat_template_kwargs: { enable_thinking: true } } },
          { name: 'plain', weight: 1 },
        ],
        counts: { total: 10, completed: 9, failed: 1, cancelled: 0 },
        usage: { prompt_tokens: 1, completion_tokens: 2, reasoning_tokens: 0 },
        quality: { flagged: 2, by_flag: { truncated: 2, repetitive: 0 }, settings: {} },
      },
      [
        { key: 'train/shard-00000.parquet', split: 'train', lines: 5, errorsKey: null, errorsLines: null },
        { key: 'eval/shard-00000.parquet', split: 'eval', lines: 1, errorsKey: 'eval/shard-00000.errors.jsonl', errorsLines: 1 },
        { key: 'train/shard-00001.parquet', split: 'train', lines: 3, errorsKey: null, errorsLines: null },
        { key: null, split: 'train', lines: 0, errorsKey: null, errorsLines: null },
      ],
    );
    expect(card.startsWith('---\n')).toBe(true);
    const front = parseYaml(card.split('---\n')[1]!);
    expect(front.configs).toEqual([
      {
        config_name: 'default',
        data_files: [
          { split: 'train', path: ['train/shard-00000.parquet', 'train/shard-00001.parquet'] },
          { split: 'eval', path: ['eval/shard-00000.parquet'] },
        ],
      },
    ]);
    expect(front.dataset_info.splits).toEqual([
      { name: 'train', num_examples: 8 },
      { name: 'eval', num_examples: 1 },
    ]);
    expect(front.dataset_info.features.find((f: any) => f.name === 'messages').list.map((f: any) => f.name)).toEqual([
      'role',
      'content',
      'reasoning_content',
      'tool_calls',
      'tool_call_id',
    ]);
    expect(card).toContain('# demo: "quoted" name');
    expect(card).toContain('| think | 3 |');
    expect(card).toContain('| truncated | 2 |');
    expect(card).not.toContain('| repetitive |');
    expect(card).toContain('5% of samples in `eval`');
  });

  const cardRun = (over: Partial<Parameters<typeof datasetCard>[0]>): Parameters<typeof datasetCard>[0] => ({
    id: 'run_x',
    name: null,
    model: 'm',
    params: {},
    createdAt: 0,
    status: 'completed',
    regenerate: null,
    format: 'jsonl',
    evalShare: 0.1,
    counts: { total: 1, completed: 1, failed: 0, cancelled: 0 },
    usage: { prompt_tokens: 1, completion_tokens: 1, reasoning_tokens: 0 },
    quality: { flagged: 0, by_flag: {}, settings: {} },
    ...over,
  });
  const shards = [{ key: 'train/shard-00000.jsonl', split: 'train', lines: 1, errorsKey: null, errorsLines: null }];
  /** A table row's cells: split on the pipes GFM reads as cell boundaries (not escaped ones). */
  const cells = (row: string) => row.split(/(?<!\\)\|/).slice(1, -1);

  it("escapes the run's name, its model and its variants' params: no heading, link, image, HTML or cell boundary of the user's making", () => {
    const name = '# [click](https://evil.example) ![x](y) <img src=x onerror=alert(1)> | *bold* _u_ ~s~ `code` \\ &amp;\n## injected heading\r\n- item';
    const card = datasetCard(
      cardRun({
        name,
        model: 'org/m`odel|x',
        params: { stop: ['```', '|'] },
        variants: [{ name: 'a', weight: 1, params: { stop: ['|', '`'] } }],
      }),
      shards,
    );
    const body = card.slice(card.indexOf('---\n', 4) + 4);
    const headingLines = body.split('\n').filter((l) => l.startsWith('#'));
    expect(headingLines[0]).toBe(
      '# \\# \\[click\\](https://evil.example) \\!\\[x\\](y) &lt;img src=x onerror=alert(1)> \\| \\*bold\\* \\_u\\_ \\~s\\~ \\`code\\` \\\\ &amp;amp; \\#\\# injected heading - item',
    );
    // The card's own headings and nothing else, each on a line of its own.
    expect(headingLines.slice(1).every((l) => l.startsWith('## ') && !l.includes('injected'))).toBe(true);
    expect(body).not.toMatch(/<img|[^\\]\]\(https:\/\/evil/);
    // The model as one code span whose fence outruns its own backtick; the pipe escaped for tables.
    expect(body).toContain('- model: ``org/m`odel\\|x``\n');
    const row = body.split('\n').find((l) => l.startsWith('| a |'))!;
    expect(cells(row)).toHaveLength(3);
    expect(cells(row)[2]).toBe(' ``{"stop":["\\|","`"]}`` ');
    // The params block's fence is longer than the run of backticks inside it.
    expect(body).toContain('````json\n{\n  "stop": [\n    "```",\n    "|"\n  ]\n}\n````\n');
  });

  it('describes a tiny eval share with the digits it needs, never as 0%', () => {
    for (const [share, shown] of [
      [0.5, '50%'],
      [0.05, '5%'],
      [0.0123, '1.23%'],
      [0.001, '0.1%'],
      [0.000123, '0.012%'],
      [0.0000001, 'less than 0.01%'],
    ] as const) {
      expect(datasetCard(cardRun({ evalShare: share }), shards)).toContain(`puts ${shown} of samples in \`eval\``);
    }
  });
});

describe("SpecForge's numeric ids read back", () => {
  it('as the literal the line was written from, even where the number prints otherwise or is not exact', () => {
    for (const id of ['7', '1e21', '-0', '9007199254740993']) {
      const text = stringifyExact(conversationsLine(line({ custom_id: id }), true));
      expect(answerOfRecord('conversations', parseStoredLine('conversations', text)).custom_id).toBe(id);
    }
    // A string id stays a string.
    const text = stringifyExact(conversationsLine(line({ custom_id: 'c-1' })));
    expect(answerOfRecord('conversations', parseStoredLine('conversations', text)).custom_id).toBe('c-1');
  });
});
