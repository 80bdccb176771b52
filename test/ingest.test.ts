import { count, eq } from 'drizzle-orm';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ingestInFreshServer, uploadStreaming, waitQueued, writeInput } from './support/ingest.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { openTestStore } from './support/store.js';

// How the store holds a large ingestion: its samples, shards and pages, and a validation cut by a
// crash. The memory bound, which no store changes, is ingest-memory.test.ts.

const tmp = tempDir('regen-ingest-test-');
const servers: ServerProcess[] = [];

afterAll(async () => {
  for (const s of servers) await s.kill('SIGKILL');
  tmp.cleanup();
});

describe('ingestion of large inputs', () => {
  it('a streamed 100K-line upload becomes 100K samples in 100 shards', async () => {
    const { server, run } = await ingestInFreshServer(tmp.dir, 100_000, servers);
    expect(run.request_counts.total).toBe(100_000);
    expect(run.request_counts.pending).toBe(100_000);
    expect(run.shards).toEqual({ total: 100, uploaded: 0 });
    expect(run.invalid_lines.count).toBe(0);

    const shards: any[] = [];
    let after: string | null = null;
    do {
      const page: any = await call(server.url, `/v1/runs/${run.id}/shards?limit=40${after ? `&after=${after}` : ''}`);
      shards.push(...page.body.data);
      after = page.body.has_more ? page.body.last_id : null;
    } while (after);
    expect(shards.map((s) => s.index)).toEqual(Array.from({ length: 100 }, (_, i) => i));
    expect(shards.every((s) => s.samples === 1000 && s.status === 'open' && s.done === 0)).toBe(true);

    for (const [customId, shard, index] of [
      ['c-0', 0, 0],
      ['c-999', 0, 999],
      ['c-1000', 1, 1000],
      ['c-54321', 54, 54321],
      ['c-99999', 99, 99999],
    ] as const) {
      const s = await call(server.url, `/v1/runs/${run.id}/samples/${customId}`);
      expect(s.status).toBe(200);
      expect(s.body).toMatchObject({ custom_id: customId, shard, index, status: 'pending' });
      expect(s.body.messages[1].content).toMatch(new RegExp(`^question ${index}: `));
    }
    const first = await call(server.url, `/v1/runs/${run.id}/samples?limit=1`);
    expect(first.body.data[0].custom_id).toBe('c-0');
    const last = await call(server.url, `/v1/runs/${run.id}/samples?limit=1&after=c-99998`);
    expect(last.body.data.map((s: any) => s.custom_id)).toEqual(['c-99999']);
    expect(last.body.has_more).toBe(false);
  });

  it('a server killed while validating validates the run again on restart, without duplicates', async () => {
    // Enough lines that the kill lands while a part of them is inserted and the rest is not; one
    // more than ten shards' worth, so the last shard is a short one.
    const SHARD = 3000;
    const LINES = 10 * SHARD + 1000;
    const input = join(tmp.dir, 'input-crash.jsonl');
    await writeInput(input, LINES);
    const dataDir = join(tmp.dir, 'data-crash');
    const first = await spawnServer(dataDir);
    servers.push(first);
    const file = await uploadStreaming(first.url, input);
    const created = await call(first.url, '/v1/runs', { method: 'POST', json: { model: 'qwen', shard_size: SHARD, input: { file_id: file.id } } });
    expect(created.status).toBe(201);
    const id: string = created.body.id;

    // Killed once the first batches are in the store: the restart finds a half-inserted run.
    const db = await openTestStore(dataDir);
    try {
      const { runs, samples } = db.t;
      const inserted = async () => (await db.q.select({ n: count() }).from(samples).where(eq(samples.runId, id)))[0].n;
      await waitFor('the first samples inserted', async () => ((await inserted()) > 0 ? true : undefined), 60_000, 10);
      await first.kill('SIGKILL');
      const [left] = await db.q.select({ status: runs.status }).from(runs).where(eq(runs.id, id));
      expect(left.status).toBe('validating');
      expect(await inserted()).toBeLessThan(LINES);
    } finally {
      await db.close();
    }

    const second = await spawnServer(dataDir);
    servers.push(second);
    const run = await waitQueued(second.url, id);
    expect(run.request_counts).toMatchObject({ total: LINES, pending: LINES });
    expect(run.shards.total).toBe(11);
    const shards = (await call(second.url, `/v1/runs/${run.id}/shards?limit=100`)).body.data;
    expect(shards.reduce((n: number, s: any) => n + s.samples, 0)).toBe(LINES);
    expect(shards.at(-1).samples).toBe(1000);
    const last = await call(second.url, `/v1/runs/${run.id}/samples?limit=5&after=c-${LINES - 2}`);
    expect(last.body.data.map((s: any) => s.custom_id)).toEqual([`c-${LINES - 1}`]);
    await second.kill('SIGKILL');
  });
});
