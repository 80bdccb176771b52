import { join } from 'node:path';
import { afterAll, expect, it } from 'vitest';
import { openDb, type Db } from '../src/db/client.js';
import { insertSampleBatch } from '../src/db/samples.js';
import { createTestDatabase, describePg, type TestDatabase } from './support/pg.js';
import { tempDir } from './support/server.js';

// Ingest's batch insert on both stores: a custom_id the run already has, or one repeated within
// the batch, takes no position, and the run's positions stay contiguous across batches.

const tmp = tempDir('regen-batches-');
let database: TestDatabase | null = null;
afterAll(async () => {
  await database?.drop();
  tmp.cleanup();
});

const sample = (customId: string) => ({ customId, request: '{"messages":[]}', predictedTokens: null });

async function check(db: Db): Promise<void> {
  await db.write((w) =>
    w.exec(
      `insert into runs (id, model, status, created_at, params, input, shard_size, output_uri, metadata, on_invalid_line, request_timeout_ms, max_attempts, updated_at)
     values ('run_b', 'm', 'validating', 1, '{}', '{"requests":1}', 2, 'file:///x/', '{}', 'skip', 1000, 5, 1)`,
    ),
  );
  const first = await db.tx((tx) => insertSampleBatch(tx, 'run_b', 0, 2, ['a', 'b', 'a', 'c'].map(sample)));
  expect(first).toEqual([true, true, false, true]);
  const second = await db.tx((tx) => insertSampleBatch(tx, 'run_b', 3, 2, ['d', 'b', 'e', 'c', 'f'].map(sample)));
  expect(second).toEqual([true, false, true, false, true]);
  const { rows } = await db.exec<{ custom_id: string; seq: number; shard_idx: number }>(
    `select custom_id, seq, shard_idx from samples where run_id = 'run_b' order by seq`,
  );
  expect(rows.map((r) => [r.custom_id, Number(r.seq), r.shard_idx])).toEqual([
    ['a', 0, 0],
    ['b', 1, 0],
    ['c', 2, 1],
    ['d', 3, 1],
    ['e', 4, 2],
    ['f', 5, 2],
  ]);
}

it('on SQLite, skips duplicates and keeps positions contiguous', async () => {
  const db = await openDb(join(tmp.dir, 'b.db'));
  try {
    await check(db);
  } finally {
    await db.close();
  }
});

await describePg('the batch insert on PostgreSQL', () => {
  it('skips duplicates in one statement and closes up the positions after a custom_id the run already had', async () => {
    database = await createTestDatabase('batches');
    const db = await openDb(database.url);
    try {
      await check(db);
    } finally {
      await db.close();
    }
  });
});
