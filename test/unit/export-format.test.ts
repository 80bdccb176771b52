import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { afterAll, describe, expect, it } from 'vitest';
import { exportWriter } from '../../src/services/runs/export-format.js';
import { tempDir } from '../support/server.js';

// The export's writers on their own: a Parquet export of many shards is one file of several row
// groups, streamed a group at a time, that DuckDB reads whole; a JSONL line's own fields keep
// their exact text in the Parquet row.

const scratch = tempDir('regen-export-unit-');
afterAll(() => scratch.cleanup());

/** A JSONL shard of `n` output lines, ids from `from`; every third line of variant b. */
function jsonlShard(from: number, n: number): Buffer {
  const lines = Array.from({ length: n }, (_, k) => {
    const i = from + k;
    return JSON.stringify({
      custom_id: `c-${String(i).padStart(5, '0')}`,
      sample_index: 0,
      messages: [{ role: 'user', content: `question ${i}` }],
      reasoning_content: null,
      content: `answer ${i}`,
      finish_reason: 'stop',
      usage: { prompt_tokens: 5, completion_tokens: i % 50, reasoning_tokens: 0, cached_tokens: 0 },
      model: 'm',
      response_id: null,
      created: null,
      endpoint_id: 'ep_1',
      latency_ms: 10,
      attempts: 1,
      flags: i % 7 === 0 ? ['too_short'] : [],
      variant: i % 3 === 0 ? 'b' : 'a',
    });
  });
  return Buffer.from(lines.join('\n') + '\n');
}

describe('exportWriter', () => {
  it('writes a Parquet file a row group at a time, each group as soon as it is full, and DuckDB reads every row', async () => {
    const writer = exportWriter('jsonl', 'parquet', null, '/v1/chat/completions');
    const pieces: Buffer[] = [];
    const SHARD = 700;
    for (let s = 0; s < 4; s++) pieces.push(await writer.shard(jsonlShard(s * SHARD, SHARD), s % 2 ? 'eval' : 'train'));
    // 700 rows wait; 1,400 make a group; 700 wait again; 1,400 again: bytes come out with the full groups.
    expect(pieces.map((p) => p.length > 0)).toEqual([false, true, false, true]);
    pieces.push(writer.end());
    const path = join(scratch.dir, 'groups.parquet');
    writeFileSync(path, Buffer.concat(pieces));
    const duck = await (await DuckDBInstance.create(':memory:')).connect();
    const meta = await duck.runAndReadAll(`select count(distinct row_group_id)::int as groups from parquet_metadata('${path}')`);
    expect(meta.getRowObjectsJson()[0]).toEqual({ groups: 2 });
    const rows = (
      await duck.runAndReadAll(
        `select custom_id, split, content, usage.completion_tokens as tokens, flags, variant from read_parquet('${path}') order by custom_id`,
      )
    ).getRowObjectsJson();
    expect(rows).toHaveLength(4 * SHARD);
    expect(rows[0]).toEqual({ custom_id: 'c-00000', split: 'train', content: 'answer 0', tokens: 0, flags: ['too_short'], variant: 'b' });
    expect(rows[SHARD]).toMatchObject({ custom_id: `c-00${SHARD}`, split: 'eval' });
    duck.closeSync();
  });

  it('keeps one variant, and a JSONL line as is', async () => {
    const shard = jsonlShard(0, 9);
    expect((await exportWriter('jsonl', 'jsonl', null, '/v1/chat/completions').shard(shard, null)).equals(shard)).toBe(true);
    const kept = (await exportWriter('jsonl', 'jsonl', 'b', '/v1/chat/completions').shard(shard, null)).toString('utf8');
    const want = shard
      .toString('utf8')
      .split('\n')
      .filter((l) => l.includes('"variant":"b"'));
    expect(kept).toBe(want.join('\n') + '\n');
  });

  it("writes a JSONL line's own fields into the Parquet row with their text, numbers parsing would change included", async () => {
    const metadata = '{"source_id":12345678901234567890,"score":1.50,"tag":"x"}';
    const line = jsonlShard(0, 1).toString('utf8').trimEnd().replace(/}$/, `,"metadata":${metadata}}`);
    const writer = exportWriter('jsonl', 'parquet', null, '/v1/chat/completions');
    const path = join(scratch.dir, 'metadata.parquet');
    writeFileSync(path, Buffer.concat([await writer.shard(Buffer.from(line + '\n'), null), writer.end()]));
    const duck = await (await DuckDBInstance.create(':memory:')).connect();
    const [row] = (await duck.runAndReadAll(`select metadata from read_parquet('${path}')`)).getRowObjectsJson();
    expect(row).toEqual({ metadata });
    duck.closeSync();
  });
});
