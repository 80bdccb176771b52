import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ASSIGN_SALTS, pickWeighted } from '../src/domain/assign.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, REGEN, startTestServer, tempDir } from './support/server.js';
import { createRun, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// Variants, the input's own fields and on_length, end to end: regen as a server, the simulator as
// its own process, the output read back from the shards. Each simulator serves a model of its own,
// so each run reaches only the simulator its case needs.

// Thinks 300 tokens, answers 12: a thinking answer is ~25 times a plain one.
const MIXED = 'qwen3-mixed-sim';
// Answers 100 tokens, no thinking, in a context of 2,048.
const LONG = 'long-sim';
/** domain/input-line.ts MAX_METADATA_BYTES (imported here, its zod schemas would be built before the routes extend zod). */
const MAX_METADATA_BYTES = 64 * 1024;
const FAST = { 'ttft-ms': 0, 'tokens-per-second': 20_000, 'max-running': 64 };
const THINK = { chat_template_kwargs: { enable_thinking: true } };
const PLAIN = { chat_template_kwargs: { enable_thinking: false } };
const VARIANTS = [
  { name: 'think', weight: 7, params: THINK },
  { name: 'plain', weight: 3, params: PLAIN },
];
const expectedVariant = (customId: string) => VARIANTS[pickWeighted(customId, [7, 3], ASSIGN_SALTS.variant)]!.name;

let server: Awaited<ReturnType<typeof startTestServer>>;
const sims: SimProcess[] = [];
const stores = new Stores({ forcePathStyle: false });
const files = tempDir('regen-variants-cli-');

beforeAll(async () => {
  sims.push(await spawnSimulator({ ...FAST, model: MIXED, 'reasoning-tokens': 300, 'completion-tokens': 12, seed: 11 }));
  sims.push(await spawnSimulator({ ...FAST, model: LONG, 'reasoning-tokens': 0, 'completion-tokens': 100, 'context-length': 2048, seed: 12 }));
  server = await startTestServer();
  for (const s of sims) await registerEndpoint(server.url, s.url);
});

afterAll(async () => {
  files.cleanup();
  await server?.cleanup();
  stores.close();
  await Promise.all(sims.map((s) => s.stop()));
});

/** Every output line and error line of a finished run, through its manifest. */
async function readOutput(run: any): Promise<{ lines: any[]; errors: any[]; manifest: any }> {
  const store = stores.forUri(run.output_uri);
  const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
  const read = async (key: string | null) =>
    key
      ? (await store.get(key))
          .toString('utf8')
          .split('\n')
          .filter(Boolean)
          .map((l) => JSON.parse(l))
      : [];
  const lines: any[] = [];
  const errors: any[] = [];
  for (const shard of manifest.shards) {
    lines.push(...(await read(shard.key)));
    errors.push(...(await read(shard.errors_key)));
  }
  return { lines, errors, manifest };
}

const question = (i: number) => `Question ${i}: what is ${i} times ${i + 3}?`;

describe('a run mixing a thinking and a plain variant', () => {
  it('sends each sample its variant’s params, names it on every line, keeps the input’s fields, and the gate does not pause the mix', async () => {
    const total = 800;
    const lines = Array.from({ length: total }, (_, i) =>
      JSON.stringify({
        custom_id: `m-${i}`,
        messages: [{ role: 'user', content: question(i) }],
        source: 'gsm8k',
        meta: { row: i, tags: ['a', i % 2 ? 'odd' : 'even'] },
      }),
    );
    // Line 801: its own fields are over the limit, refused with its line number; the rest go on.
    lines.push(JSON.stringify({ custom_id: 'too-big', prompt: 'hi', meta: 'x'.repeat(MAX_METADATA_BYTES) }));
    const fileId = await uploadFile(server.url, lines.join('\n') + '\n');
    const created = await createRun(server.url, {
      model: MIXED,
      input: { file_id: fileId },
      params: { temperature: 0.6, max_tokens: 1024 },
      variants: VARIANTS,
      shard_size: 200,
      on_invalid_line: 'skip',
      quality: { min_completion_tokens: 0 },
    });
    expect(created.variants.map((v: any) => v.name)).toEqual(['think', 'plain']);
    const done = await waitForStatus(server.url, created.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.invalid_lines.count).toBe(1);
    expect(done.invalid_lines.errors[0]).toMatchObject({
      line: total + 1,
      custom_id: 'too-big',
      message: expect.stringContaining(`${MAX_METADATA_BYTES} bytes`),
    });

    const { lines: out, manifest } = await readOutput(done);
    expect(out).toHaveLength(total);
    const perVariant = { think: 0, plain: 0 } as Record<string, number>;
    for (const line of out) {
      const i = Number(line.custom_id.slice(2));
      // The stable choice, and the variant's params reached the server: thinking on or off in the answer.
      expect(line.variant).toBe(expectedVariant(line.custom_id));
      perVariant[line.variant]++;
      if (line.variant === 'think') expect(line.reasoning_content).toMatch(/^Reasoning about/);
      else expect(line.reasoning_content).toBeNull();
      expect(line.flags).toEqual([]);
      expect(line.metadata).toEqual({ source: 'gsm8k', meta: { row: i, tags: ['a', i % 2 ? 'odd' : 'even'] } });
    }
    expect(Math.abs(perVariant.think! / total - 0.7)).toBeLessThan(0.06);
    expect(done.quality.flagged).toBe(0);

    // The run's counters per variant add up to its own.
    expect(done.variants.map((v: any) => v.request_counts)).toEqual([
      { total: perVariant.think, completed: perVariant.think, failed: 0 },
      { total: perVariant.plain, completed: perVariant.plain, failed: 0 },
    ]);
    const sum = (k: string) => done.variants.reduce((t: number, v: any) => t + v.usage[k], 0);
    expect(sum('completion_tokens')).toBe(done.usage.completion_tokens);
    expect(sum('prompt_tokens')).toBe(done.usage.prompt_tokens);
    expect(done.variants[1].usage.reasoning_tokens).toBe(0);
    expect(done.variants[0].usage.reasoning_tokens).toBe(300 * perVariant.think!);
    expect(manifest.variants.map((v: any) => [v.name, v.weight, v.params, v.counts])).toEqual([
      ['think', 7, THINK, { total: perVariant.think, completed: perVariant.think, failed: 0 }],
      ['plain', 3, PLAIN, { total: perVariant.plain, completed: perVariant.plain, failed: 0 }],
    ]);

    const sample = await call(server.url, `/v1/runs/${done.id}/samples/m-5`);
    expect(sample.body).toMatchObject({ variant: expectedVariant('m-5'), metadata: { source: 'gsm8k', meta: { row: 5, tags: ['a', 'odd'] } }, params: null });

    // A second run of part of the same input: the same custom_ids get the same variants.
    const again = await createRun(server.url, {
      model: MIXED,
      input: { requests: Array.from({ length: 60 }, (_, i) => ({ custom_id: `m-${i}`, prompt: question(i) })) },
      variants: VARIANTS,
    });
    const second = await waitForStatus(server.url, again.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(second.status).toBe('completed');
    for (const line of (await readOutput(second)).lines) expect(line.variant).toBe(expectedVariant(line.custom_id));
  });

  it('merges chat_template_kwargs run → variant → line: a variant or a line adding a kwarg keeps the run’s enable_thinking', async () => {
    const requests = [
      ...Array.from({ length: 6 }, (_, i) => ({ custom_id: `kw-${i}`, prompt: question(i) })),
      { custom_id: 'line-kw', prompt: question(7), params: { chat_template_kwargs: { line_kw: 3 } } },
      { custom_id: 'line-thinks', prompt: question(8), params: { chat_template_kwargs: { enable_thinking: true } } },
    ];
    const created = await createRun(server.url, {
      model: MIXED,
      input: { requests },
      params: { max_tokens: 1024, chat_template_kwargs: { enable_thinking: false } },
      variants: [{ name: 'extra', weight: 1, params: { chat_template_kwargs: { variant_kw: 2 } } }],
      quality: { min_completion_tokens: 0 },
    });
    expect(created.variants[0]).toMatchObject({
      params: { chat_template_kwargs: { variant_kw: 2 } },
      effective_params: { max_tokens: 1024, chat_template_kwargs: { enable_thinking: false, variant_kw: 2 } },
    });
    const done = await waitForStatus(server.url, created.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.variants[0].effective_params).toEqual(created.variants[0].effective_params);
    const { lines } = await readOutput(done);
    expect(lines).toHaveLength(requests.length);
    // The simulator thinks unless it receives enable_thinking: false, so an answer without reasoning shows the run's kwarg arrived.
    for (const line of lines) {
      if (line.custom_id === 'line-thinks') expect(line.reasoning_content).toMatch(/^Reasoning about/);
      else expect(line.reasoning_content, line.custom_id).toBeNull();
    }
  });

  it('refuses n in a variant, naming the field', async () => {
    const res = await call(server.url, '/v1/runs', {
      method: 'POST',
      json: { model: MIXED, input: { requests: [{ prompt: 'hi' }] }, variants: [{ name: 'a', weight: 1, params: { n: 1 } }] },
    });
    expect(res.status).toBe(422);
    expect(res.body).toMatchObject({ field: 'variants[0].params.n', detail: expect.stringContaining('run only') });
  });
});

describe('on_length', () => {
  // 100-token answers against a first max_tokens of 30: cut twice (30, 60), whole at 120.
  const prompts = (n: number, tag: string) => Array.from({ length: n }, (_, i) => ({ custom_id: `${tag}-${i}`, prompt: question(i) }));

  it('"retry" asks a cut answer again with max_tokens doubled: every line ends by stop, and one the context cannot hold fails length_exhausted', async () => {
    const requests = [...prompts(40, 'r'), { custom_id: 'huge', prompt: 'Write at length. [len=100000]' }];
    const created = await createRun(server.url, { model: LONG, input: { requests }, params: { max_tokens: 30 }, on_length: 'retry' });
    expect(created.on_length).toBe('retry');
    const done = await waitForStatus(server.url, created.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status, done.status_reason).toBe('completed');
    const { lines, errors } = await readOutput(done);
    expect(lines).toHaveLength(40);
    for (const line of lines) {
      expect(line.finish_reason).toBe('stop');
      expect(line.flags).not.toContain('truncated');
      expect(line.usage.completion_tokens).toBe(100);
      expect(line.attempts).toBe(3);
    }
    // 30, 60, 120, …, 1920, then what the context of 2,048 leaves after the prompt: still cut.
    expect(errors).toEqual([
      { custom_id: 'huge', sample_index: 0, error: { code: 'length_exhausted', message: expect.stringContaining('2048'), status: null }, attempts: 8 },
    ]);
  });

  it('"fail" fails a cut answer at once with a clear error; "keep" keeps it flagged', async () => {
    const failing = await createRun(server.url, { model: LONG, input: { requests: prompts(20, 'f') }, params: { max_tokens: 30 }, on_length: 'fail' });
    const keeping = await createRun(server.url, { model: LONG, input: { requests: prompts(20, 'k') }, params: { max_tokens: 30 } });
    const failed = await waitForStatus(server.url, failing.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(failed.request_counts).toMatchObject({ completed: 0, failed: 20 });
    const { errors } = await readOutput(failed);
    expect(errors).toHaveLength(20);
    for (const e of errors) expect(e).toMatchObject({ error: { code: 'truncated', message: expect.stringContaining('on_length is "fail"') }, attempts: 1 });
    const kept = await waitForStatus(server.url, keeping.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(kept.on_length).toBe('keep');
    expect(kept.request_counts).toMatchObject({ completed: 20 });
    for (const line of (await readOutput(kept)).lines) expect(line).toMatchObject({ finish_reason: 'length', flags: expect.arrayContaining(['truncated']) });
  });
});

describe('the CLI', () => {
  it('submits variants from a file with on_length, and `status RUN` shows a table of the variants', async () => {
    const root = fileURLToPath(new URL('..', import.meta.url));
    const regen = (args: string[]) => promisify(execFile)(process.execPath, [...REGEN, ...args], { cwd: root, env: { ...process.env, REGEN_URL: server.url } });
    const prompts = join(files.dir, 'prompts.jsonl');
    writeFileSync(prompts, Array.from({ length: 30 }, (_, i) => JSON.stringify({ id: `c-${i}`, prompt: question(i) })).join('\n') + '\n');
    const variants = join(files.dir, 'variants.json');
    writeFileSync(variants, JSON.stringify(VARIANTS));
    const submitted = await regen(['submit', prompts, '--model', MIXED, '--variants', `@${variants}`, '--on-length', 'retry', '--watch']);
    const runId = /run_[0-9a-z]+/.exec(submitted.stdout + submitted.stderr)?.[0];
    expect(runId, submitted.stderr).toBeDefined();
    const { stdout } = await regen(['status', runId!]);
    expect(stdout).toMatch(/on length\s+retry/);
    expect(stdout).toMatch(/VARIANT\s+WEIGHT\s+DONE\/TOTAL/);
    const run = (await call(server.url, `/v1/runs/${runId}`)).body;
    for (const v of run.variants)
      expect(stdout).toMatch(new RegExp(`${v.name}\\s+${v.weight} \\([\\d.]+%\\)\\s+${v.request_counts.total}/${v.request_counts.total}`));
  });
});
