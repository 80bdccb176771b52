import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { ASSIGN_SALTS, pickSplit, pickWeighted } from '../src/domain/assign.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, startTestServer, tempDir } from './support/server.js';
import { completedRun, createRun, readManifestFiles, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// The dataset features together, end to end: variants × n answers × a split × Parquet in one run
// (DuckDB reads the shards back), variants with conversations regenerated turn by turn (in JSONL
// and in SpecForge's conversations format), and on_length on conversation turns. Regen runs as a
// server on the test's store, the simulator as its own process; each simulator serves a model of
// its own, so each run reaches only the one its case needs.

// Thinks 40 tokens when asked to, answers 12.
const MODEL = 'qwen3-combo-sim';
// Answers 12 tokens unless a turn asks more ("[len=N]"), no thinking, in a context of 2,048.
const LONG = 'long-combo-sim';
const FAST = { 'ttft-ms': 0, 'tokens-per-second': 20_000, 'max-running': 64 };
const THINK = { chat_template_kwargs: { enable_thinking: true } };
const PLAIN = { chat_template_kwargs: { enable_thinking: false } };
const VARIANTS = [
  { name: 'think', weight: 1, params: THINK },
  { name: 'plain', weight: 1, params: PLAIN },
];
const variantOf = (customId: string) => VARIANTS[pickWeighted(customId, [1, 1], ASSIGN_SALTS.variant)]!.name;
const FINAL = ['completed', 'failed', 'paused', 'cancelled'];

let server: Awaited<ReturnType<typeof startTestServer>>;
const sims: SimProcess[] = [];
const stores = new Stores({ forcePathStyle: false });
const scratch = tempDir('regen-combined-');

beforeAll(async () => {
  sims.push(await spawnSimulator({ ...FAST, model: MODEL, 'reasoning-tokens': 40, 'completion-tokens': 12, seed: 21 }));
  sims.push(await spawnSimulator({ ...FAST, model: LONG, 'reasoning-tokens': 0, 'completion-tokens': 12, 'context-length': 2048, seed: 22 }));
  server = await startTestServer();
  for (const s of sims) await registerEndpoint(server.url, s.url);
});

afterAll(async () => {
  await server?.cleanup();
  stores.close();
  await Promise.all(sims.map((s) => s.stop()));
  scratch.cleanup();
});

const finished = (body: Record<string, unknown>) => completedRun(server.url, body);

/** The run's manifest and every file it lists, by key. */
const readOutput = (run: any) => readManifestFiles(stores.forUri(run.output_uri));

const linesOf = (b: Buffer | undefined) =>
  (b ?? Buffer.alloc(0))
    .toString('utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));

describe('variants × n × split × Parquet in one run', () => {
  const PROMPTS = 120;
  const N = 3;
  const EVAL = 0.2;

  it('DuckDB reads every shard: each answer once, in its variant and split, all n of a prompt in one split, and the card and manifest add up', async () => {
    const lines = Array.from({ length: PROMPTS }, (_, i) =>
      JSON.stringify({ custom_id: `v-${i}`, messages: [{ role: 'user', content: `Question ${i}: what is ${i} plus ${i * 3}?` }], source: 'combo', row: i }),
    );
    const fileId = await uploadFile(server.url, lines.join('\n') + '\n');
    const before = (await sims[0]!.stats()).requests;
    const run = await finished({
      model: MODEL,
      input: { file_id: fileId },
      params: { n: N, temperature: 0.8, max_tokens: 512 },
      variants: VARIANTS,
      split: { eval: EVAL },
      output: { format: 'parquet' },
      shard_size: 50,
      quality: { min_completion_tokens: 0 },
    });
    expect(run.request_counts).toMatchObject({ total: PROMPTS * N, completed: PROMPTS * N, failed: 0 });
    // One request a prompt for its n answers (none was flagged, so none was asked again alone).
    expect((await sims[0]!.stats()).requests - before).toBe(PROMPTS);

    const { manifest, files } = await readOutput(run);
    const shards = manifest.files.filter((f: any) => f.kind === 'parquet');
    expect(shards.every((f: any) => /^(train|eval)\/shard-\d{5}\.parquet$/.test(f.key) && f.key.startsWith(`${f.split}/`))).toBe(true);
    expect(new Set(shards.map((f: any) => f.split))).toEqual(new Set(['train', 'eval']));
    // The manifest's counts add up: every shard's rows, the splits', the variants'.
    expect(shards.reduce((n: number, f: any) => n + f.count, 0)).toBe(PROMPTS * N);
    expect(manifest.shards.reduce((n: number, s: any) => n + s.lines, 0)).toBe(PROMPTS * N);
    expect(manifest.variants.reduce((n: number, v: any) => n + v.counts.completed, 0)).toBe(PROMPTS * N);

    const paths: string[] = shards.map((f: any) => join(scratch.dir, run.id, f.key));
    for (const [i, f] of shards.entries()) {
      mkdirSync(dirname(paths[i]!), { recursive: true });
      writeFileSync(paths[i]!, files.get(f.key)!);
    }
    const duck = await (await DuckDBInstance.create(':memory:')).connect();
    for (const [i, f] of shards.entries()) {
      const r = await duck.runAndReadAll(`select count(*)::int as n, count(distinct split)::int as s, min(split) as split from read_parquet('${paths[i]}')`);
      expect(r.getRowObjectsJson()[0]).toEqual({ n: f.count, s: 1, split: f.split });
    }
    const rows = (
      await duck.runAndReadAll(
        `select custom_id, sample_index, variant, split, reasoning_content, content, finish_reason, metadata, usage.prompt_tokens as prompt_tokens, usage.completion_tokens as completion_tokens from read_parquet([${paths.map((p) => `'${p}'`).join(',')}])`,
      )
    ).getRowObjectsJson() as any[];
    duck.closeSync();
    expect(rows).toHaveLength(PROMPTS * N);

    const seen = new Set<string>();
    const splitsOf = new Map<string, Set<string>>();
    const perVariant: Record<string, number> = { think: 0, plain: 0 };
    for (const r of rows) {
      const key = `${r.custom_id}#${r.sample_index}`;
      expect(seen.has(key), key).toBe(false);
      seen.add(key);
      expect(r.variant).toBe(variantOf(r.custom_id));
      expect(r.split).toBe(pickSplit(r.custom_id, EVAL));
      splitsOf.set(r.custom_id, (splitsOf.get(r.custom_id) ?? new Set()).add(r.split));
      perVariant[r.variant]!++;
      // The variant's params reached the server: thinking on or off in the answer.
      if (r.variant === 'think') expect(r.reasoning_content).toMatch(/^Reasoning about/);
      else expect(r.reasoning_content).toBeNull();
      expect(r.finish_reason).toBe('stop');
      expect(JSON.parse(r.metadata)).toEqual({ source: 'combo', row: Number(r.custom_id.slice(2)) });
    }
    for (let i = 0; i < PROMPTS; i++) for (let k = 0; k < N; k++) expect(seen.has(`v-${i}#${k}`)).toBe(true);
    for (const [id, s] of splitsOf) expect(s.size, id).toBe(1);
    // The request's prompt goes on answer 0 of its n, the completion shared among them: the rows add up to the run.
    expect(rows.reduce((n, r) => n + r.prompt_tokens, 0)).toBe(run.usage.prompt_tokens);
    expect(rows.reduce((n, r) => n + r.completion_tokens, 0)).toBe(run.usage.completion_tokens);
    for (const r of rows) if (r.sample_index > 0) expect(r.prompt_tokens).toBe(0);
    // Both variants and both splits are there, and the variants' counts are the rows'.
    expect(perVariant.think! * perVariant.plain!).toBeGreaterThan(0);
    expect(manifest.variants.map((v: any) => [v.name, v.counts.total])).toEqual([
      ['think', perVariant.think],
      ['plain', perVariant.plain],
    ]);
    expect(run.variants.map((v: any) => v.request_counts.completed)).toEqual([perVariant.think, perVariant.plain]);
    for (const k of ['prompt_tokens', 'completion_tokens', 'reasoning_tokens'])
      expect(
        run.variants.reduce((n: number, v: any) => n + v.usage[k], 0),
        k,
      ).toBe(run.usage[k]);

    // The card names every shard under its split, with the splits' row counts.
    expect(manifest.card).toBe('README.md');
    const front = parseYaml(files.get('README.md')!.toString('utf8').split('---\n')[1]!);
    for (const d of front.configs[0].data_files as { split: string; path: string[] }[])
      expect([...d.path].sort()).toEqual(
        shards
          .filter((f: any) => f.split === d.split)
          .map((f: any) => f.key)
          .sort(),
      );
    const card = files.get('README.md')!.toString('utf8');
    for (const v of VARIANTS) expect(card).toContain(v.name);
    const bySplit = Object.fromEntries(front.dataset_info.splits.map((s: any) => [s.name, s.num_examples]));
    expect(bySplit).toEqual({ train: rows.filter((r) => r.split === 'train').length, eval: rows.filter((r) => r.split === 'eval').length });

    // The sample route reads any answer of a line back out of its split's Parquet shard.
    for (const r of rows.filter((x) => x.sample_index === N - 1).slice(0, 5)) {
      const sample = await call(server.url, `/v1/runs/${run.id}/samples/${r.custom_id}?sample_index=${N - 1}`);
      expect(sample.status).toBe(200);
      expect(sample.body).toMatchObject({ variant: r.variant, output: { content: r.content, reasoning_content: r.reasoning_content } });
    }
  });
});

type Message = { role: string; content: string };

/** Conversations of 1–4 user turns in SpecForge's `conversations` shape, with a field of their own. */
function conversations(n: number, tag: string, userTurn: (i: number, k: number) => string = (i, k) => `Conversation ${i}, turn ${k}: and then?`) {
  return Array.from({ length: n }, (_, i) => {
    const turns: Message[] = [];
    for (let k = 0; k < 1 + (i % 4); k++) turns.push({ role: 'user', content: userTurn(i, k) }, { role: 'assistant', content: `an old reply ${k}` });
    return { id: `${tag}-${i}`, conversations: turns, source: `set-${i % 3}` };
  });
}

describe('variants with regenerate: "all_assistant"', () => {
  const COUNT = 50;
  const input = conversations(COUNT, 'c');
  let fileId: string;
  let jsonl: Map<string, any>;

  it('chooses the variant per conversation: every turn asked with its params, the line naming its variant with its turns and metadata', async () => {
    fileId = await uploadFile(server.url, input.map((l) => JSON.stringify(l)).join('\n') + '\n');
    const run = await finished({ model: MODEL, input: { file_id: fileId }, regenerate: 'all_assistant', variants: VARIANTS, shard_size: 20 });
    const { manifest, files } = await readOutput(run);
    const lines = manifest.files.filter((f: any) => f.kind === 'jsonl').flatMap((f: any) => linesOf(files.get(f.key)));
    expect(lines).toHaveLength(COUNT);
    jsonl = new Map(lines.map((l: any) => [l.custom_id, l]));
    const totalTurns = input.reduce((n, c) => n + c.conversations.length / 2, 0);
    expect(run.turns).toMatchObject({ total: totalTurns, completed: totalTurns, failed: 0 });
    const perVariant: Record<string, number> = { think: 0, plain: 0 };
    for (const c of input) {
      const line = jsonl.get(c.id);
      expect(line.variant).toBe(variantOf(c.id));
      perVariant[line.variant]++;
      expect(line.metadata).toEqual({ source: c.source });
      expect(line.turns).toHaveLength(c.conversations.length / 2);
      // Each turn's answer shows its variant's thinking, on or off: the whole conversation in one variant.
      const replies = line.messages.filter((m: any) => m.role === 'assistant');
      expect(replies).toHaveLength(line.turns.length);
      for (const m of replies) {
        if (line.variant === 'think') expect(m.reasoning_content).toMatch(/^Reasoning about/);
        else expect(m.reasoning_content).toBeNull();
      }
      expect(line.turns.every((t: any) => t.finish_reason === 'stop')).toBe(true);
    }
    expect(perVariant.think! * perVariant.plain!).toBeGreaterThan(0);
    expect(run.variants.map((v: any) => v.request_counts.completed)).toEqual([perVariant.think, perVariant.plain]);
    // Every turn's tokens count in its conversation's variant: the variants' usage adds up to the run's and to the lines'.
    for (const k of ['prompt_tokens', 'completion_tokens', 'reasoning_tokens']) {
      expect(
        run.variants.reduce((n: number, v: any) => n + v.usage[k], 0),
        k,
      ).toBe(run.usage[k]);
      expect(
        lines.reduce((n: number, l: any) => n + l.usage[k], 0),
        k,
      ).toBe(run.usage[k]);
    }
    expect(run.variants[1].usage.reasoning_tokens).toBe(0);
  });

  it("in the conversations format: SpecForge's shape with the regenerated turns", async () => {
    const run = await finished({
      model: MODEL,
      input: { file_id: fileId },
      regenerate: 'all_assistant',
      variants: VARIANTS,
      shard_size: 20,
      output: { format: 'conversations' },
    });
    const { manifest, files } = await readOutput(run);
    const lines = manifest.files.filter((f: any) => f.kind === 'jsonl').flatMap((f: any) => linesOf(files.get(f.key)));
    expect(lines).toHaveLength(COUNT);
    for (const line of lines) {
      const l = jsonl.get(line.id);
      expect(line).toEqual({
        id: l.custom_id,
        source: l.metadata.source,
        variant: l.variant,
        status: 'success',
        conversations: l.messages.map((m: any) =>
          m.role === 'assistant'
            ? { role: 'assistant', content: m.content, ...(m.reasoning_content !== null && { reasoning_content: m.reasoning_content }) }
            : { role: m.role, content: m.content },
        ),
      });
    }
  });

  it('in Parquet with a split: the regenerated messages, turns and variant as in JSONL, each conversation in its split', async () => {
    const run = await finished({
      model: MODEL,
      input: { file_id: fileId },
      regenerate: 'all_assistant',
      variants: VARIANTS,
      shard_size: 20,
      output: { format: 'parquet' },
      split: { eval: 0.3 },
    });
    const { manifest, files } = await readOutput(run);
    const shards = manifest.files.filter((f: any) => f.kind === 'parquet');
    const paths: string[] = shards.map((f: any) => join(scratch.dir, run.id, f.key));
    for (const [i, f] of shards.entries()) {
      mkdirSync(dirname(paths[i]!), { recursive: true });
      writeFileSync(paths[i]!, files.get(f.key)!);
    }
    const duck = await (await DuckDBInstance.create(':memory:')).connect();
    const rows = (
      await duck.runAndReadAll(
        `select custom_id, split, variant, messages, turns, metadata, content from read_parquet([${paths.map((p) => `'${p}'`).join(',')}])`,
      )
    ).getRowObjectsJson() as any[];
    duck.closeSync();
    expect(rows).toHaveLength(COUNT);
    expect(new Set(rows.map((r) => r.split))).toEqual(new Set(['train', 'eval']));
    for (const r of rows) {
      const l = jsonl.get(r.custom_id);
      expect(r.split).toBe(pickSplit(r.custom_id, 0.3));
      expect(r.variant).toBe(l.variant);
      expect(r.content).toBe(l.content);
      expect(r.messages).toEqual(
        l.messages.map((m: any) => ({
          role: m.role,
          content: m.content,
          reasoning_content: m.reasoning_content ?? null,
          tool_calls: null,
          tool_call_id: null,
        })),
      );
      expect(JSON.parse(r.turns).map((t: any) => t.finish_reason)).toEqual(l.turns.map((t: any) => t.finish_reason));
      expect(JSON.parse(r.turns)).toHaveLength(l.turns.length);
      expect(JSON.parse(r.metadata)).toEqual(l.metadata);
    }
  });

  it('refuses n > 1 with all_assistant, at creation and at validation, naming params.n', async () => {
    const body = { model: MODEL, input: { file_id: fileId }, regenerate: 'all_assistant', variants: VARIANTS, params: { n: 2 } };
    for (const path of ['/v1/runs', '/v1/runs/validate']) {
      const res = await call(server.url, path, { method: 'POST', json: body });
      expect(res.status, path).toBe(422);
      expect(res.body, path).toMatchObject({ field: 'params.n', detail: expect.stringContaining('all_assistant') });
    }
  });
});

describe('on_length on conversation turns', () => {
  // Turn 0 asks 100 tokens, turn 1 50, turn 2 the simulator's 12, against a first max_tokens of 30.
  const asks = ['[len=100]', '[len=50]', ''];
  const input = conversations(12, 'l', (i, k) => `Conversation ${i}, turn ${k} ${asks[k % 3]}`).map((c) => ({
    ...c,
    conversations: c.conversations.slice(0, 6),
  }));

  it('"retry" asks a cut turn again with max_tokens doubled, and the next turn from the params\' own', async () => {
    const run = await finished({ model: LONG, input: { requests: input }, regenerate: 'all_assistant', params: { max_tokens: 30 }, on_length: 'retry' });
    const { manifest, files } = await readOutput(run);
    const lines = manifest.files.filter((f: any) => f.kind === 'jsonl').flatMap((f: any) => linesOf(files.get(f.key)));
    expect(lines).toHaveLength(input.length);
    for (const line of lines) {
      // 30, 60, 120 for turn 0; 30, 60 for turn 1 (not the 120 turn 0 ended with); 30 for turn 2.
      expect(line.turns.map((t: any) => [t.finish_reason, t.attempts, t.usage.completion_tokens])).toEqual(
        [
          ['stop', 3, 100],
          ['stop', 2, 50],
          ['stop', 1, 12],
        ].slice(0, line.turns.length),
      );
      expect(line.flags).toEqual([]);
    }
  });

  it('"fail" fails the conversation at its cut turn, the error line naming the turn', async () => {
    // Turn 1 asks 100 tokens against a max_tokens of 60; a conversation of one turn is not cut.
    const cut = conversations(12, 'f', (i, k) => `Conversation ${i}, turn ${k} ${k === 1 ? '[len=100]' : ''}`);
    const whole = cut.filter((c) => c.conversations.length === 2).length;
    const run = await createRun(server.url, {
      model: LONG,
      input: { requests: cut },
      regenerate: 'all_assistant',
      params: { max_tokens: 60 },
      on_length: 'fail',
    });
    const done = await waitForStatus(server.url, run.id, FINAL);
    expect(done.request_counts).toMatchObject({ completed: whole, failed: cut.length - whole });
    expect(done.turns).toMatchObject({ failed: cut.length - whole });
    const { manifest, files } = await readOutput(done);
    const errors = manifest.files.filter((f: any) => f.kind === 'errors').flatMap((f: any) => linesOf(files.get(f.key)));
    expect(errors).toHaveLength(cut.length - whole);
    for (const e of errors)
      expect(e).toMatchObject({
        turn: 1,
        attempts: 1,
        error: { code: 'truncated', message: expect.stringMatching(/^turn 1's answer was cut at max_tokens 60/) },
      });
  });
});

describe('on_length with n answers a prompt', () => {
  it('a cut answer asked again beside a flagged sibling keeps its raised max_tokens', async () => {
    // Choice 0 comes back degenerate (flagged too_short), choice 1 cut at 30 (it asks 50): both go out again together.
    const requests = Array.from({ length: 6 }, (_, i) => ({ custom_id: `s-${i}`, prompt: `Prompt ${i} [len=50] [empty-choice=0]` }));
    const run = await finished({
      model: LONG,
      input: { requests },
      params: { n: 2, max_tokens: 30 },
      on_length: 'retry',
      quality: { min_completion_tokens: 10, retry_flagged: 2, gate: false },
    });
    const { manifest, files } = await readOutput(run);
    const lines = manifest.files.filter((f: any) => f.kind === 'jsonl').flatMap((f: any) => linesOf(files.get(f.key)));
    expect(lines).toHaveLength(12);
    for (const l of lines) expect([l.finish_reason, l.flags]).toEqual(['stop', []]);
    // Choice 1: sent at 30 (cut), then at 60 beside its flagged sibling, whole. (Without its raise
    // kept, it is cut again at 30 beside it.) Choice 0: flagged twice beside it, then asked alone
    // (n = 1 spoils nothing) at 30, cut, and at 60.
    expect(lines.map((l: any) => [l.custom_id, l.sample_index, l.attempts])).toEqual(
      requests.flatMap((r) => [
        [r.custom_id, 0, 4],
        [r.custom_id, 1, 2],
      ]),
    );
  });
});
