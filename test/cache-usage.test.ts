import { join } from 'node:path';
import { afterAll, expect, it } from 'vitest';
import { addCacheUsage, getRunWithCacheUsage, type CacheUsage } from '../src/db/cache-usage.js';
import { openDb, type Db } from '../src/db/client.js';
import { createTestDatabase, describePg, type TestDatabase } from './support/pg.js';
import { tempDir } from './support/server.js';

// The answered tokens by run and endpoint on both stores: a commit adds every run's and endpoint's
// in one statement, and a run's read comes with its row.

const tmp = tempDir('regen-cache-usage-');
let database: TestDatabase | null = null;
afterAll(async () => {
  await database?.drop();
  tmp.cleanup();
});

const usage = (rows: [runId: string, endpointId: string, prompt: number, cached: number][]) => {
  const byRun = new Map<string, Map<string, CacheUsage>>();
  for (const [runId, endpointId, promptTokens, cachedTokens] of rows) {
    if (!byRun.has(runId)) byRun.set(runId, new Map());
    byRun.get(runId)!.set(endpointId, { endpointId, promptTokens, cachedTokens });
  }
  return byRun;
};

async function check(db: Db): Promise<void> {
  for (const id of ['run_a', 'run_b', 'run_c']) {
    await db.write((w) =>
      w.exec(
        `insert into runs (id, model, status, created_at, params, input, shard_size, output_uri, metadata, on_invalid_line, request_timeout_ms, max_attempts, updated_at)
       values (?, 'm', 'in_progress', 1, '{}', '{"requests":1}', 2, ?, '{}', 'skip', 1000, 5, 1)`,
        [id, `file:///x/${id}/`],
      ),
    );
  }
  // Two commits, each for two runs and two endpoints, given out of key order.
  await db.tx((tx) =>
    addCacheUsage(
      tx,
      usage([
        ['run_b', 'ep_2', 100, 10],
        ['run_a', 'ep_2', 40, 0],
        ['run_b', 'ep_1', 7, 7],
        ['run_a', 'ep_1', 1000, 900],
      ]),
    ),
  );
  await db.tx((tx) =>
    addCacheUsage(
      tx,
      usage([
        ['run_a', 'ep_1', 500, 400],
        ['run_b', 'ep_3', 3, 0],
      ]),
    ),
  );
  await db.tx((tx) => addCacheUsage(tx, new Map()));

  const a = await getRunWithCacheUsage(db, 'run_a');
  expect(a?.run).toMatchObject({ id: 'run_a', status: 'in_progress', outputUri: 'file:///x/run_a/' });
  expect(a?.cacheUsage).toEqual([
    { endpointId: 'ep_1', endpointName: null, promptTokens: 1500, cachedTokens: 1300 },
    { endpointId: 'ep_2', endpointName: null, promptTokens: 40, cachedTokens: 0 },
  ]);
  expect((await getRunWithCacheUsage(db, 'run_b'))?.cacheUsage).toEqual([
    { endpointId: 'ep_1', endpointName: null, promptTokens: 7, cachedTokens: 7 },
    { endpointId: 'ep_2', endpointName: null, promptTokens: 100, cachedTokens: 10 },
    { endpointId: 'ep_3', endpointName: null, promptTokens: 3, cachedTokens: 0 },
  ]);
  // A run with no answers yet has its row and no usage; an unknown run, nothing.
  const c = await getRunWithCacheUsage(db, 'run_c');
  expect(c?.run.id).toBe('run_c');
  expect(c?.cacheUsage).toEqual([]);
  expect(await getRunWithCacheUsage(db, 'run_none')).toBeUndefined();
}

it('on SQLite, adds every run and endpoint of a commit and reads a run with its usage', async () => {
  const db = await openDb(join(tmp.dir, 'u.db'));
  try {
    await check(db);
  } finally {
    await db.close();
  }
});

await describePg('the answered tokens by endpoint on PostgreSQL', () => {
  it('adds every run and endpoint of a commit in one statement and reads a run with its usage', async () => {
    database = await createTestDatabase('cache_usage');
    const db = await openDb(database.url);
    try {
      await check(db);
    } finally {
      await db.close();
    }
  });
});
