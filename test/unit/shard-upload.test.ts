import { join } from 'node:path';
import { afterAll, expect, it } from 'vitest';
import { closeDb, openDb } from '../../src/db/client.js';
import { getRun } from '../../src/db/runs.js';
import { closedOpenShards } from '../../src/db/shards.js';
import type { RunnerDeps } from '../../src/deps.js';
import { uploadShard } from '../../src/runner/shard-writer.js';
import { tempDir } from '../support/server.js';

const NOW = 1_700_000_000_000;
const tmp = tempDir();
afterAll(() => tmp.cleanup());

it('an upload started from a shard row listed before another upload of it ended changes nothing and fails nothing', async () => {
  const db = await openDb(join(tmp.dir, 'stale.db'));
  const exec = (text: string, params: unknown[] = []) => db.write((w) => w.exec(text, params));
  try {
    await exec(
      `insert into runs (id, model, status, created_at, params, input, shard_size, output_uri, metadata, on_invalid_line, request_timeout_ms, max_attempts, updated_at, total, completed, shards_total)
       values ('run_a', 'm', 'in_progress', ?, '{}', '{"requests":1}', 2, 'file:///nowhere/', '{}', 'fail', 1000, 5, ?, 2, 2, 1)`,
      [NOW, NOW],
    );
    await exec(`insert into shards (run_id, idx, first_seq, sample_count, terminal_count) values ('run_a', 0, 0, 2, 2)`);
    for (let i = 0; i < 2; i++) {
      await exec(`insert into samples (run_id, seq, shard_idx, custom_id, request, status) values ('run_a', ?, 0, ?, '{}', 'completed')`, [i, `s${i}`]);
    }
    // The finisher lists the shard as closed and open...
    const [listed] = await closedOpenShards(db, 'run_a', 8);
    expect(listed).toMatchObject({ idx: 0, status: 'open' });
    // ...while an upload of it already under way ends: the shard uploaded, its staging rows dropped.
    await exec(`update shards set status = 'uploaded', key = 'shard-00000.jsonl' where run_id = 'run_a' and idx = 0`);
    await exec(`delete from staging where run_id = 'run_a'`);
    const run = (await getRun(db, 'run_a'))!;
    // The stale row is seen for what it is, before any sample is read or any object written.
    const deps = { db, clock: () => NOW } as unknown as RunnerDeps;
    await expect(uploadShard(deps, run, listed)).resolves.toBe(false);
  } finally {
    await closeDb(db);
  }
});
