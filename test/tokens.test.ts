import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Stores } from '../src/storage/index.js';
import { answerIds, promptIds } from '../src/sim/token-ids.js';
import { callsText } from '../src/sim/text.js';
import { readParquetRows } from '../src/storage/parquet.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, REGEN, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { checkDatabase, createRun, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// Training rows (`output.tokens`) end to end on simulator processes: every generation kept in the
// output has exactly one row, whose input_ids are the simulator's prompt ids (recomputed here from
// what was sent) followed by its answer's ids, and whose loss mask is zeros then ones; a kill -9
// loses none and writes none twice; ids that disagree with usage are asked again, never written;
// endpoints that return no ids are left out; a "six-token" server pauses the run.

const LATENCY = { 'ttft-ms': 10, 'tokens-per-second': 3000, 'completion-tokens': 24, 'reasoning-tokens': 16 };
const TERMINAL = ['completed', 'failed', 'paused', 'cancelled'];

type Message = { role: string; content: string | null; [k: string]: unknown };

const data = tempDir('regen-tokens-');
const scratch = tempDir('regen-tokens-duck-');
const sims: SimProcess[] = [];
let server: ServerProcess | null = null;

async function sim(flags: Record<string, string | number> = {}): Promise<SimProcess> {
  const s = await spawnSimulator({ ...LATENCY, ...flags });
  sims.push(s);
  return s;
}

beforeAll(async () => {
  server = await spawnServer(data.dir);
});

afterAll(async () => {
  await server?.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  data.cleanup();
  scratch.cleanup();
});

/** The manifest, every text line by (custom_id, sample_index), and every training row, each key checked to appear once. */
async function readRun(outputUri: string): Promise<{ manifest: any; lines: Map<string, any>; rows: any[]; card: string | null; files: Map<string, Buffer> }> {
  const stores = new Stores({ forcePathStyle: false });
  try {
    const store = stores.forUri(outputUri);
    const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
    const files = new Map<string, Buffer>();
    for (const f of manifest.files) files.set(f.key, await store.get(f.key));
    const lines = new Map<string, any>();
    const rows: any[] = [];
    for (const f of manifest.files) {
      const body = files.get(f.key)!;
      if (f.kind === 'jsonl') {
        for (const l of body
          .toString('utf8')
          .trimEnd()
          .split('\n')
          .map((t) => JSON.parse(t))) {
          const key = `${l.custom_id ?? l.id}#${l.sample_index ?? 0}`;
          expect(lines.has(key), `${key} written twice`).toBe(false);
          lines.set(key, l);
        }
      }
      if (f.kind === 'tokens' && f.key.endsWith('.jsonl')) {
        const parsed = body
          .toString('utf8')
          .trimEnd()
          .split('\n')
          .map((t) => JSON.parse(t));
        expect(parsed).toHaveLength(f.count);
        rows.push(...parsed);
      }
    }
    const seen = new Set<string>();
    for (const r of rows) {
      const key = `${r.custom_id}#${r.sample_index}#${r.turn}#${r.step}`;
      expect(seen.has(key), `row ${key} written twice`).toBe(false);
      seen.add(key);
    }
    const card = manifest.card ? files.get(manifest.card)!.toString('utf8') : null;
    return { manifest, lines, rows, card, files };
  } finally {
    stores.close();
  }
}

/** A row is the prompt's ids then the answer's, masked 0 then 1, its trainable count the answer's ids. */
function expectRow(row: any, sent: Message[], reasoning: string | null, content: string | null, finish: string, tokens: number): void {
  const prompt = promptIds(sent);
  const answer = answerIds(`${reasoning ?? ''}${content ?? ''}`, tokens, finish === 'stop' || finish === 'tool_calls');
  expect(row.input_ids).toEqual([...prompt, ...answer]);
  expect(row.loss_mask).toEqual([...prompt.map(() => 0), ...answer.map(() => 1)]);
  expect(row.num_trainable).toBe(answer.length);
  expect(row.loss_mask.reduce((a: number, b: number) => a + b, 0)).toBe(row.num_trainable);
  expect(row.finish_reason).toBe(finish);
}

describe('output.tokens: training rows from the server ids', () => {
  it('a plain run with n = 2: one row per kept answer, in the manifest, and the counts exact', async () => {
    const s = await sim();
    await registerEndpoint(server!.url, s.url, { name: 'plain' });
    const prompts = Array.from({ length: 60 }, (_, i) => ({
      custom_id: `p-${i}`,
      messages: [{ role: 'user', content: `Plain question ${i}: how far is ${i} miles in km?` }],
    }));
    const fileId = await uploadFile(server!.url, prompts.map((p) => JSON.stringify(p)).join('\n') + '\n');
    const { id } = await createRun(server!.url, {
      model: 'sim-model',
      input: { file_id: fileId },
      shard_size: 25,
      params: { n: 2, max_tokens: 256 },
      output: { tokens: true },
    });
    const done = await waitForStatus(server!.url, id, TERMINAL);
    expect(done.status).toBe('completed');
    expect(done.output_tokens).toBe(true);
    const { manifest, lines, rows, card } = await readRun(done.output_uri);
    expect(lines.size).toBe(120);
    expect(rows).toHaveLength(120);
    expect(manifest.files.filter((f: any) => f.kind === 'tokens').every((f: any) => /^tokens\/shard-\d{5}\.jsonl$/.test(f.key))).toBe(true);
    for (const row of rows) {
      const line = lines.get(`${row.custom_id}#${row.sample_index}`);
      expect(row).toMatchObject({ turn: null, step: null, variant: null, split: null, flags: line.flags });
      // Where ids exist, the line's own completion tokens are its choice's generated ids, not a share.
      expectRow(row, line.messages, line.reasoning_content, line.content, line.finish_reason, line.usage.completion_tokens);
    }
    expect(manifest.tokens).toMatchObject({ format: 'jsonl', rows: 120 });
    expect(manifest.tokens.num_trainable.overall.rows).toBe(120);
    expect(card).toContain('config_name: "tokens"');
    expect(card).toContain('## Training rows');

    // The run, the sample route and `regen status` show the trainable tokens.
    const run = (await call(server!.url, `/v1/runs/${id}`)).body;
    expect(run.num_trainable).toEqual(manifest.tokens.num_trainable);
    const row = rows.find((r) => r.custom_id === 'p-3' && r.sample_index === 1);
    expect((await call(server!.url, `/v1/runs/${id}/samples/p-3?sample_index=1`)).body.trainable_tokens).toBe(row.num_trainable);
    const status = spawnSync(process.execPath, [...REGEN, 'status', id], { env: { ...process.env, REGEN_URL: server!.url }, encoding: 'utf8' });
    expect(status.stdout).toMatch(
      new RegExp(`trainable\\s+min ${run.num_trainable.overall.min}, p5 \\d+, median ${run.num_trainable.overall.median}, p95 \\d+, max \\d+ over 120 rows`),
    );
  });

  it('a conversation run with a split and two variants, in Parquet: a row per turn, read back by DuckDB', async () => {
    const s = await sim({ model: 'conv-model' });
    await registerEndpoint(server!.url, s.url, { name: 'conv' });
    const lines = Array.from({ length: 40 }, (_, i) => {
      const messages: Message[] = [];
      if (i % 3 === 0) messages.push({ role: 'system', content: `You are helper ${i}.` });
      for (let t = 0; t < 1 + (i % 3); t++) {
        messages.push({ role: 'user', content: `Conversation ${i}, question ${t}` });
        messages.push({ role: 'assistant', content: `old answer ${t}` });
      }
      return JSON.stringify({ custom_id: `c-${i}`, messages });
    });
    const fileId = await uploadFile(server!.url, lines.join('\n') + '\n');
    const { id } = await createRun(server!.url, {
      model: 'conv-model',
      input: { file_id: fileId },
      shard_size: 10,
      regenerate: 'all_assistant',
      params: { max_tokens: 256 },
      variants: [
        { name: 'think', weight: 1, params: { chat_template_kwargs: { enable_thinking: true } } },
        { name: 'plain', weight: 1, params: { chat_template_kwargs: { enable_thinking: false } } },
      ],
      split: { eval: 0.3 },
      output: { format: 'parquet', tokens: true },
    });
    const done = await waitForStatus(server!.url, id, TERMINAL);
    expect(done.status, done.status_reason).toBe('completed');
    const { manifest, files, card } = await readRun(done.output_uri);
    const tokenFiles = manifest.files.filter((f: any) => f.kind === 'tokens');
    expect(tokenFiles.every((f: any) => /^tokens\/(train|eval)\/shard-\d{5}\.parquet$/.test(f.key))).toBe(true);
    expect(new Set(tokenFiles.map((f: any) => f.split))).toEqual(new Set(['train', 'eval']));

    // DuckDB reads local files: the rows as stored, copied out of the store.
    const duck = await (await DuckDBInstance.create(':memory:')).connect();
    const paths = tokenFiles.map((f: any) => join(scratch.dir, id, f.key));
    for (const [i, f] of tokenFiles.entries()) {
      mkdirSync(dirname(paths[i]), { recursive: true });
      writeFileSync(paths[i], files.get(f.key)!);
    }
    const types = await duck.runAndReadAll(`select column_name, column_type from (describe select * from read_parquet('${paths[0]}'))`);
    const typeOf = Object.fromEntries(types.getRowObjectsJson().map((r: any) => [r.column_name, r.column_type]));
    expect(typeOf).toMatchObject({ input_ids: 'INTEGER[]', loss_mask: 'TINYINT[]', num_trainable: 'INTEGER' });
    const read = await duck.runAndReadAll(
      `select custom_id, sample_index, turn, step, variant, split, input_ids, loss_mask, num_trainable, finish_reason, flags from read_parquet([${paths.map((p: string) => `'${p}'`).join(',')}])`,
    );
    const rows = read.getRowObjectsJson() as any[];
    expect(rows).toHaveLength(tokenFiles.reduce((n: number, f: any) => n + f.count, 0));

    const texts = new Map<string, any>();
    for (const f of manifest.files.filter((x: any) => x.kind === 'parquet')) {
      for (const r of await readParquetRows(files.get(f.key)!)) texts.set(r.custom_id as string, r);
    }
    expect(texts.size).toBe(40);
    let expected = 0;
    for (const [cid, line] of texts) {
      const turns = JSON.parse(line.turns as string) as any[];
      const messages = line.messages as Message[];
      const assistants = messages.flatMap((m, k) => (m.role === 'assistant' ? [k] : []));
      expect(assistants).toHaveLength(turns.length);
      expected += turns.length;
      for (const [k, at] of assistants.entries()) {
        const row = rows.find((r) => r.custom_id === cid && r.turn === turns[k].turn && r.step === turns[k].step);
        expect(row, `${cid} turn ${k}`).toBeDefined();
        expect(row).toMatchObject({ sample_index: 0, variant: line.variant, split: line.split });
        const m = messages[at];
        // The history a turn was asked with: the regenerated replies, their content only.
        const sent = messages.slice(0, at).map((x) => (x.role === 'assistant' ? { role: 'assistant', content: x.content } : x));
        expectRow(row, sent, m.reasoning_content as string | null, m.content, turns[k].finish_reason, turns[k].usage.completion_tokens);
      }
    }
    expect(rows).toHaveLength(expected);
    expect(manifest.tokens.num_trainable.variants).toHaveProperty('think');
    expect(manifest.tokens.num_trainable.variants).toHaveProperty('plain');
    expect(card).toMatch(/config_name: "tokens"[\s\S]*tokens\/train\/shard-00000\.parquet/);
    duck.closeSync();
  });

  it('an agentic run: a row per step and per answer, none for the steps a truncated conversation dropped', async () => {
    const s = await sim({ model: 'agent-model' });
    await registerEndpoint(server!.url, s.url, { name: 'agent' });
    const tools = ['search', 'calc', 'lookup'].map((name) => ({ type: 'function', function: { name, parameters: { type: 'object', properties: {} } } }));
    const lines = Array.from({ length: 30 }, (_, i) => {
      const messages: Message[] = [];
      for (let t = 0; t < 2; t++) {
        const calls = (i + t) % 2 === 0 ? ['search', 'calc'] : [];
        messages.push({ role: 'user', content: `Agent ${i}, turn ${t} ${calls.length ? `[tools=${calls.join('|')}]` : ''}` });
        for (const [k, name] of calls.entries()) {
          // Every fifth source renames its second turn's first call: the line is cut after turn 0.
          const source = i % 5 === 4 && t === 1 && k === 0 ? 'lookup' : name;
          messages.push({
            role: 'assistant',
            content: null,
            tool_calls: [{ id: `src_${i}_${t}_${k}`, type: 'function', function: { name: source, arguments: '{}' } }],
          });
          messages.push({ role: 'tool', content: `result ${i}.${t}.${k}`, tool_call_id: `src_${i}_${t}_${k}` });
        }
        messages.push({ role: 'assistant', content: `old answer ${t}` });
      }
      return JSON.stringify({ custom_id: `a-${i}`, messages, tools });
    });
    const fileId = await uploadFile(server!.url, lines.join('\n') + '\n');
    const { id } = await createRun(server!.url, {
      model: 'agent-model',
      input: { file_id: fileId },
      shard_size: 10,
      regenerate: 'all_assistant',
      params: { max_tokens: 256 },
      output: { tokens: true },
    });
    const done = await waitForStatus(server!.url, id, TERMINAL);
    expect(done.status, done.status_reason).toBe('completed');
    const { lines: texts, rows } = await readRun(done.output_uri);
    let expected = 0;
    let steps = 0;
    let cut = 0;
    for (const [key, line] of texts) {
      const cid = key.split('#')[0];
      const assistants = (line.messages as Message[]).flatMap((m, k) => (m.role === 'assistant' ? [k] : []));
      expect(assistants).toHaveLength(line.turns.length);
      expected += line.turns.length;
      const i = Number(cid.split('-')[1]);
      if (i % 5 === 4 && (i + 1) % 2 === 0) {
        cut++;
        expect(line.flags).toContain('tool_mismatch');
        expect(line.turns.every((t: any) => t.turn === 0)).toBe(true);
      }
      for (const [k, at] of assistants.entries()) {
        const t = line.turns[k];
        const row = rows.find((r) => r.custom_id === cid && r.turn === t.turn && r.step === t.step);
        expect(row, `${cid} request ${k}`).toBeDefined();
        const m = line.messages[at];
        if (m.tool_calls) steps++;
        const text = m.tool_calls ? callsText(m.tool_calls) : m.content;
        expectRow(row, line.messages.slice(0, at), m.reasoning_content, text, t.finish_reason, t.usage.completion_tokens);
      }
    }
    expect(steps).toBeGreaterThan(0);
    expect(cut).toBe(3);
    expect(rows).toHaveLength(expected);
  });

  it('kill -9 mid-run: every kept answer still has exactly one row', async () => {
    const s = await sim({ model: 'kill-model', 'tokens-per-second': 400, 'max-running': 16 });
    await registerEndpoint(server!.url, s.url, { name: 'kill' });
    const prompts = Array.from({ length: 300 }, (_, i) =>
      JSON.stringify({ custom_id: `k-${i}`, messages: [{ role: 'user', content: `Killed question ${i}` }] }),
    );
    const fileId = await uploadFile(server!.url, prompts.join('\n') + '\n');
    const { id } = await createRun(server!.url, {
      model: 'kill-model',
      input: { file_id: fileId },
      shard_size: 40,
      params: { max_tokens: 256 },
      output: { tokens: true },
    });
    const url = server!.url;
    await waitFor('a third of the run', async () => ((await call(url, `/v1/runs/${id}`)).body.request_counts.completed >= 100 ? true : undefined), 90_000, 50);
    await server!.kill('SIGKILL');
    expect((await checkDatabase(data.dir, id)).in_progress).toBeGreaterThan(0);
    server = await spawnServer(data.dir);
    const done = await waitForStatus(server.url, id, TERMINAL);
    expect(done.status, done.status_reason).toBe('completed');
    const { lines, rows } = await readRun(done.output_uri);
    expect(lines.size).toBe(300);
    expect(rows).toHaveLength(300);
    // The sglext ids come back on a stream: the loop watch is kept. Only the probes were not
    // streamed, one for each regen process (what a probe found lives in memory).
    const stats = await s.stats();
    expect(stats.streamed).toBe(stats.requests - 2);
    for (const row of rows) {
      const line = lines.get(`${row.custom_id}#0`);
      expectRow(row, line.messages, line.reasoning_content, line.content, line.finish_reason, line.usage.completion_tokens);
    }
  });

  it('ids that disagree with usage: those answers asked again, never written', async () => {
    const s = await sim({ model: 'skew-model', 'token-id-mismatch-rate': 0.3 });
    await registerEndpoint(server!.url, s.url, { name: 'skew' });
    const prompts = Array.from({ length: 80 }, (_, i) =>
      JSON.stringify({ custom_id: `s-${i}`, messages: [{ role: 'user', content: `Skewed question ${i}` }] }),
    );
    const fileId = await uploadFile(server!.url, prompts.join('\n') + '\n');
    const { id } = await createRun(server!.url, {
      model: 'skew-model',
      input: { file_id: fileId },
      shard_size: 40,
      params: { max_tokens: 256 },
      output: { tokens: true },
    });
    const done = await waitForStatus(server!.url, id, TERMINAL);
    expect(done.status, done.status_reason).toBe('completed');
    const { lines, rows } = await readRun(done.output_uri);
    expect(rows).toHaveLength(80);
    for (const row of rows) {
      const line = lines.get(`${row.custom_id}#0`);
      expectRow(row, line.messages, line.reasoning_content, line.content, line.finish_reason, line.usage.completion_tokens);
    }
    // Each skewed answer was malformed_response: asked again, and counted on its sample's attempts.
    const stats = await s.stats();
    const attempts = [...lines.values()].reduce((n, l) => n + l.attempts, 0);
    expect(attempts).toBeGreaterThan(80);
    // One probe: the ids came back, untrusted or not.
    expect(stats.completed - 1).toBe(attempts);
  });

  it('an endpoint that returns no ids serves no such run, and the run says why while none is left', async () => {
    const old = await sim({ model: 'old-model', 'token-id-api': 'none' });
    await registerEndpoint(server!.url, old.url, { name: 'old-server' });
    const prompts = Array.from({ length: 20 }, (_, i) => JSON.stringify({ custom_id: `o-${i}`, messages: [{ role: 'user', content: `Old question ${i}` }] }));
    const fileId = await uploadFile(server!.url, prompts.join('\n') + '\n');
    const { id } = await createRun(server!.url, { model: 'old-model', input: { file_id: fileId }, params: { max_tokens: 256 }, output: { tokens: true } });
    const url = server!.url;
    const waiting = await waitFor('the run to say why it waits', async () => {
      const run = (await call(url, `/v1/runs/${id}`)).body;
      return run.status_reason?.includes('old-server return none') ? run : undefined;
    });
    expect(waiting.request_counts.completed).toBe(0);
    // Nothing held claimed for it meanwhile: its samples wait pending.
    await waitFor('no sample claimed', async () => ((await call(url, `/v1/runs/${id}`)).body.request_counts.in_progress === 0 ? true : undefined));
    // A run without output.tokens is served there as ever.
    const plain = await createRun(url, { model: 'old-model', input: { file_id: fileId }, params: { max_tokens: 256 } });
    expect((await waitForStatus(url, plain.id, TERMINAL)).status).toBe('completed');
    // An endpoint that asks return_token_ids unstreamed (an older SGLang) takes the run.
    const newer = await sim({ model: 'old-model', 'token-id-api': 'token_ids' });
    await registerEndpoint(url, newer.url, { name: 'newer-server' });
    const done = await waitForStatus(url, id, TERMINAL);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.status_reason).toBeNull();
    // The old server answered only the plain run and the probes (sglext, return_token_ids streamed, then unstreamed); the newer one refused to stream ids.
    expect((await old.stats()).completed).toBe(20 + 3);
    expect((await newer.stats()).streamed).toBe(0);
    expect((await readRun(done.output_uri)).rows).toHaveLength(20);
  });

  it('a "six-token" server pauses the run within 300 samples, naming the trainable-token share', async () => {
    // Paced (16 at a time, 20 ms each) and long enough that the run cannot end before the gate has
    // judged it: at the other tests' pace it answered all 600 first once, in the suite.
    const s = await sim({ model: 'six-model', 'degenerate-rate': 1, 'max-running': 16, 'ttft-ms': 20 });
    await registerEndpoint(server!.url, s.url, { name: 'six', max_concurrency: 16 });
    const prompts = Array.from({ length: 1200 }, (_, i) => JSON.stringify({ custom_id: `x-${i}`, messages: [{ role: 'user', content: `Six question ${i}` }] }));
    const fileId = await uploadFile(server!.url, prompts.join('\n') + '\n');
    const { id } = await createRun(server!.url, {
      model: 'six-model',
      input: { file_id: fileId },
      params: { max_tokens: 256, chat_template_kwargs: { enable_thinking: false } },
      quality: { retry_flagged: 0 },
      output: { tokens: true },
    });
    const paused = await waitForStatus(server!.url, id, TERMINAL);
    expect(paused.status).toBe('paused');
    expect(paused.request_counts.completed).toBeLessThanOrEqual(300);
    expect(paused.status_reason).toMatch(/few_trainable 100%/);
    expect(paused.status_reason).toMatch(/100% of rows have fewer than 16 trainable tokens/);
  });
});
