import OpenAI, { toFile } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { openTestStore } from './support/store.js';
import { checkDatabase, createRun, digestOf, expectCountersMatchRecount, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// params.n > 1: each input line makes n samples, asked in one request with `n`, each choice its
// own output line with a sample_index, exactly once per (custom_id, sample_index), a kill -9 included.

const PROMPTS = 300;
const N = 3;
// Not a multiple of N: a line's answers straddle shards.
const SHARD_SIZE = 100;
// Every 25th prompt asks the simulator to make its choice 1 degenerate: flagged, and asked again alone.
const EMPTY_EVERY = 25;
const PARAMS = { n: N, max_tokens: 256, chat_template_kwargs: { enable_thinking: true } };
const QUALITY = { retry_flagged: 1, gate: false };

const data = tempDir('regen-nsamples-');
let sim: SimProcess;
let server: ServerProcess | null = null;

function prompts(tag: string): { jsonl: string; messages: Map<string, { role: string; content: string }[]> } {
  const messages = new Map<string, { role: string; content: string }[]>();
  const lines: string[] = [];
  for (let i = 0; i < PROMPTS; i++) {
    const id = `${tag}-${i}`;
    const m = [{ role: 'user', content: `Question ${i} of ${tag}${i % EMPTY_EVERY === 0 ? ' [empty-choice=1]' : ''}` }];
    messages.set(id, m);
    lines.push(JSON.stringify({ custom_id: id, messages: m }));
  }
  return { jsonl: lines.join('\n') + '\n', messages };
}

/** Every output line of a finished run, checked against its manifest: (custom_id, sample_index) → line. */
async function readOutput(outputUri: string): Promise<Map<string, any>> {
  const stores = new Stores({ forcePathStyle: false });
  try {
    const store = stores.forUri(outputUri);
    const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
    const lines = new Map<string, any>();
    for (const shard of manifest.shards) {
      if (!shard.key) continue;
      const text = (await store.get(shard.key)).toString('utf8').trimEnd();
      const parsed = text.split('\n').map((l) => JSON.parse(l));
      expect(parsed.length).toBe(shard.lines);
      for (const line of parsed) {
        const key = `${line.custom_id}#${line.sample_index}`;
        expect(lines.has(key), `${key} written twice`).toBe(false);
        lines.set(key, line);
      }
    }
    return lines;
  } finally {
    stores.close();
  }
}

/** Each prompt's N lines: answers to its own messages, sample_index 0…N−1, the choices different. */
function expectEveryChoice(lines: Map<string, any>, messages: Map<string, { role: string; content: string }[]>): void {
  expect(lines.size).toBe(PROMPTS * N);
  for (const [id, m] of messages) {
    const contents = new Set<string>();
    for (let k = 0; k < N; k++) {
      const line = lines.get(`${id}#${k}`);
      expect(line, `${id} sample_index ${k}`).toBeDefined();
      expect(line.messages).toEqual(m);
      expect(line.content.startsWith(`Answer ${digestOf(m)}`), `${id}#${k}: ${line.content.slice(0, 40)}`).toBe(true);
      contents.add(line.content);
    }
    // n sequences sampled apart, not one answer copied n times. (A choice asked again alone is the
    // simulator's answer to one choice, its choice 0's text: it reads no seed.)
    const retried = [...Array(N).keys()].some((k) => lines.get(`${id}#${k}`).attempts > 1);
    if (!retried) expect(contents.size).toBe(N);
  }
}

beforeAll(async () => {
  sim = await spawnSimulator({ 'ttft-ms': 20, 'tokens-per-second': 2000, 'max-running': 32, 'completion-tokens': 64, 'reasoning-tokens': 32 });
  server = await spawnServer(data.dir);
  await registerEndpoint(server.url, sim.url);
});

afterAll(async () => {
  await server?.kill('SIGKILL');
  await sim?.stop();
  data.cleanup();
});

describe('params.n: several answers per prompt', () => {
  it('makes n lines per prompt from one request each, and asks a flagged choice again alone', async () => {
    const base = server!.url;
    const input = prompts('a');
    const before = (await sim.stats()).requests;
    const fileId = await uploadFile(base, input.jsonl);
    const { id } = await createRun(base, { model: 'sim-model', input: { file_id: fileId }, shard_size: SHARD_SIZE, params: PARAMS, quality: QUALITY });
    const done = await waitForStatus(base, id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: PROMPTS * N, completed: PROMPTS * N, failed: 0 });

    const lines = await readOutput(done.output_uri);
    expectEveryChoice(lines, input.messages);
    // One request a prompt, and one more for each flagged choice, asked alone (n = 1 has no choice 1 to spoil).
    const flagged = Math.ceil(PROMPTS / EMPTY_EVERY);
    expect((await sim.stats()).requests - before).toBe(PROMPTS + flagged);
    for (const [key, line] of lines) {
      const [cid, k] = key.split('#');
      const spoiled = Number(cid.split('-')[1]) % EMPTY_EVERY === 0 && k === '1';
      expect(line.attempts, key).toBe(spoiled ? 2 : 1);
      expect(line.flags, key).toEqual([]);
    }

    // Usage: the prompt once per request, on its first choice; the completion tokens shared out, adding up to the run's.
    const sum = (f: (u: any) => number) => [...lines.values()].reduce((a, l) => a + f(l.usage), 0);
    expect(sum((u) => u.completion_tokens)).toBeLessThanOrEqual(done.usage.completion_tokens);
    expect(sum((u) => u.prompt_tokens)).toBeLessThanOrEqual(done.usage.prompt_tokens);
    for (const [key, line] of lines) {
      if (key.endsWith('#2')) expect(line.usage.prompt_tokens, key).toBe(0);
      if (key.endsWith('#0')) expect(line.usage.prompt_tokens, key).toBeGreaterThan(0);
      expect(line.usage.completion_tokens, key).toBeGreaterThan(0);
    }

    // The sample route picks an answer by ?sample_index=; pages never end inside a line.
    const retried = await call(base, `/v1/runs/${id}/samples/a-0?sample_index=1`);
    expect(retried.status).toBe(200);
    expect(retried.body).toMatchObject({ custom_id: 'a-0', sample_index: 1, attempts: 2, status: 'completed' });
    expect(retried.body.output.content).toBe(lines.get('a-0#1').content);
    const first = await call(base, `/v1/runs/${id}/samples/a-0`);
    expect(first.body.sample_index).toBe(0);
    expect((await call(base, `/v1/runs/${id}/samples/a-0?sample_index=${N}`)).status).toBe(404);
    const seen = new Set<string>();
    let after: string | null = null;
    for (;;) {
      const page: any = await call(base, `/v1/runs/${id}/samples?limit=100${after ? `&after=${after}` : ''}`);
      for (const s of page.body.data) seen.add(`${s.custom_id}#${s.sample_index}`);
      if (!page.body.has_more) break;
      after = page.body.last_id;
    }
    expect(seen.size).toBe(PROMPTS * N);
    await expectCountersMatchRecount(base, done);
  });

  it('keeps each (custom_id, sample_index) once through a kill -9, re-asking at most what was in flight', async () => {
    await sim.configure({ tokensPerSecond: 400 });
    const input = prompts('k');
    const before = (await sim.stats()).requests;
    const fileId = await uploadFile(server!.url, input.jsonl);
    const { id } = await createRun(server!.url, { model: 'sim-model', input: { file_id: fileId }, shard_size: SHARD_SIZE, params: PARAMS, quality: QUALITY });
    const url = server!.url;
    await waitFor(
      'the run to be a third done',
      async () => {
        const run = (await call(url, `/v1/runs/${id}`)).body;
        return run.request_counts.completed >= (PROMPTS * N) / 3 ? run : undefined;
      },
      90_000,
      50,
    );
    await server!.kill('SIGKILL');
    // Leased at the kill: every request that may have to be asked again holds at least one of these.
    const left = await checkDatabase(data.dir, id);
    expect(left.in_progress).toBeGreaterThan(0);
    // The lines with an answer leased at the kill: at most one request each was in flight.
    const db = await openTestStore(data.dir);
    const leasedLines = await db
      .exec<{ n: number | string }>(`select count(distinct custom_id) as n from samples where run_id = ? and status = 'in_progress'`, [id])
      .finally(() => db.close());
    const inFlight = Number(leasedLines.rows[0].n);
    server = await spawnServer(data.dir);
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: PROMPTS * N, completed: PROMPTS * N });
    expectEveryChoice(await readOutput(done.output_uri), input.messages);
    const requests = (await sim.stats()).requests - before;
    const flagged = Math.ceil(PROMPTS / EMPTY_EVERY);
    console.log(
      `n samples through a kill -9: ${JSON.stringify({ requests, prompts: PROMPTS, flagged, leased_samples: left.in_progress, leased_lines: inFlight })}`,
    );
    expect(requests).toBeGreaterThanOrEqual(PROMPTS);
    expect(requests).toBeLessThanOrEqual(PROMPTS + flagged + inFlight);
  });

  it('keeps an OpenAI batch line that asks n as one sample, its n choices in the one body', async () => {
    const client = new OpenAI({ baseURL: `${server!.url}/v1`, apiKey: 'unused' });
    const lines = Array.from({ length: 6 }, (_, i) => ({
      custom_id: `b-${i}`,
      method: 'POST',
      url: '/v1/chat/completions',
      body: { model: 'sim-model', messages: [{ role: 'user', content: `Batch question ${i}` }], n: N },
    }));
    const before = (await sim.stats()).requests;
    const file = await client.files.create({
      file: await toFile(Buffer.from(lines.map((l) => JSON.stringify(l)).join('\n') + '\n'), 'b.jsonl'),
      purpose: 'batch',
    });
    const batch = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    const done = await waitFor(
      'the batch to finish',
      async () => {
        const b = await client.batches.retrieve(batch.id);
        return ['completed', 'failed', 'cancelled', 'expired'].includes(b.status) ? b : undefined;
      },
      60_000,
      200,
    );
    expect(done.status).toBe('completed');
    expect(done.request_counts).toEqual({ total: 6, completed: 6, failed: 0 });
    const out = (await (await client.files.content(done.output_file_id!)).text())
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(out).toHaveLength(6);
    for (const record of out) {
      const { body } = record.response;
      expect(body.choices.map((c: any) => c.index)).toEqual([0, 1, 2]);
      const digest = digestOf(lines.find((l) => l.custom_id === record.custom_id)!.body.messages);
      for (const c of body.choices) expect(c.message.content, JSON.stringify(c)).toMatch(new RegExp(`^Answer ${digest}`));
      expect(new Set(body.choices.map((c: any) => c.message.content)).size).toBe(N);
    }
    // One request a line, not one a choice.
    expect((await sim.stats()).requests - before).toBe(6);
  });

  it('refuses n > 1 on a line, past its bound, and with conversations regenerated turn by turn', async () => {
    const base = server!.url;
    const lines = [JSON.stringify({ custom_id: 'x', messages: [{ role: 'user', content: 'q' }], params: { n: 2 } })].join('\n');
    const fileId = await uploadFile(base, lines + '\n');
    const { id } = await createRun(base, { model: 'sim-model', input: { file_id: fileId } });
    const failed = await waitForStatus(base, id, ['failed', 'queued', 'completed']);
    expect(failed.status).toBe('failed');
    expect(failed.status_reason).toMatch(/params\.n: n > 1 is a run's setting/);
    const tooMany = await call(base, '/v1/runs', { method: 'POST', json: { model: 'sim-model', input: { file_id: fileId }, params: { n: 65 } } });
    expect(tooMany.status).toBe(422);
    const conv = await call(base, '/v1/runs', {
      method: 'POST',
      json: { model: 'sim-model', input: { file_id: fileId }, params: { n: 2 }, regenerate: 'all_assistant' },
    });
    expect(conv.status).toBe(422);
  });
});
