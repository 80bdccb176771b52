import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ASSIGN_SALTS, pickWeighted } from '../src/domain/assign.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { checkDatabase, createRun, registerEndpoint, waitForStatus } from './support/runner-checks.js';
import { openTestStore } from './support/store.js';

// A run with variants and on_length "retry" through a SIGKILL of the server: each sample keeps its
// variant, and one asked again with a larger max_tokens keeps it, so after the restart it goes on
// from there instead of being cut again at the first max_tokens.

const SAMPLES = 300;
const MODEL = 'crash-variants-sim';
const VARIANTS = [
  { name: 'cool', weight: 1, params: { temperature: 0.2 } },
  { name: 'warm', weight: 2, params: { temperature: 1.0 } },
];

const data = tempDir('regen-variants-crash-');
const stores = new Stores({ forcePathStyle: false });
let sim: SimProcess;
let server: ServerProcess | null = null;

beforeAll(async () => {
  // 100-token answers, at 2,000 tokens a second: a run of max_tokens 30 needs three tries a sample (30, 60, 120).
  sim = await spawnSimulator({
    model: MODEL,
    'ttft-ms': 5,
    'tokens-per-second': 2000,
    'completion-tokens': 100,
    'reasoning-tokens': 0,
    'max-running': 8,
    seed: 4,
  });
});

afterAll(async () => {
  await server?.kill('SIGKILL');
  await sim?.stop();
  stores.close();
  data.cleanup();
});

describe('variants and on_length through a SIGKILL', () => {
  it('keeps each sample’s variant and its raised max_tokens across the restart', async () => {
    server = await spawnServer(data.dir);
    await registerEndpoint(server.url, sim.url);
    const requests = Array.from({ length: SAMPLES }, (_, i) => ({ custom_id: `k-${i}`, prompt: `Question ${i}: name ${i % 7} primes.`, origin: { row: i } }));
    const { id } = await createRun(server.url, {
      model: MODEL,
      input: { requests },
      params: { max_tokens: 30 },
      variants: VARIANTS,
      on_length: 'retry',
      shard_size: 50,
    });
    const url = server.url;
    const seen = await waitFor(
      'a third of the run done',
      async () => {
        const run = (await call(url, `/v1/runs/${id}`)).body;
        return run.request_counts.completed >= SAMPLES / 3 ? run : undefined;
      },
      90_000,
      20,
    );
    expect(seen.status).toBe('in_progress');
    await server.kill('SIGKILL');

    // What the killed server left: samples asked again with more room, each with its max_tokens stored.
    const db = await openTestStore(data.dir);
    let raised: { max_tokens: number | null; status: string }[];
    try {
      raised = (
        await db.exec<{ max_tokens: number | null; status: string }>(`select max_tokens, status from samples where run_id = ? and max_tokens is not null`, [id])
      ).rows;
    } finally {
      await db.close();
    }
    expect(raised.filter((r) => r.status !== 'completed').length).toBeGreaterThan(0);
    expect(raised.every((r) => r.max_tokens === 60 || r.max_tokens === 120)).toBe(true);

    server = await spawnServer(data.dir);
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status, done.status_reason).toBe('completed');
    await checkDatabase(data.dir, id);

    const store = stores.forUri(done.output_uri);
    const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
    const lines: any[] = [];
    for (const shard of manifest.shards)
      if (shard.key)
        lines.push(
          ...(await store.get(shard.key))
            .toString('utf8')
            .split('\n')
            .filter(Boolean)
            .map((l: string) => JSON.parse(l)),
        );
    expect(lines).toHaveLength(SAMPLES);
    expect(new Set(lines.map((l) => l.custom_id)).size).toBe(SAMPLES);
    for (const line of lines) {
      expect(line.variant).toBe(VARIANTS[pickWeighted(line.custom_id, [1, 2], ASSIGN_SALTS.variant)]!.name);
      expect(line.finish_reason).toBe('stop');
      expect(line.metadata).toEqual({ origin: { row: Number(line.custom_id.slice(2)) } });
    }
    // Three sends a sample (30, 60, 120); one more at most for those cut off in flight by the kill.
    // Had the raised max_tokens been lost, every sample waiting at 60 or 120 would start over at 30.
    const extra = lines.filter((l) => l.attempts > 3);
    expect(lines.every((l) => l.attempts >= 3 && l.attempts <= 4)).toBe(true);
    expect(extra.length).toBeLessThanOrEqual(seen.request_counts.in_progress + 16);
    const counted = done.variants.reduce((t: number, v: any) => t + v.request_counts.completed, 0);
    expect(counted).toBe(SAMPLES);
  });
});
