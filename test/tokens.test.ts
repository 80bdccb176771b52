import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Stores } from '../src/storage/index.js';
import { answerIds, promptIds } from '../src/sim/token-ids.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { createRun, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

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
  });
});
