import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, expect, it } from 'vitest';
import { closeDb, openDb } from '../../src/db/client.js';
import { getRun } from '../../src/db/runs.js';
import { closedOpenShards, listRunShards, recordPendingDigests } from '../../src/db/shards.js';
import type { RunnerDeps } from '../../src/deps.js';
import { tokenRow } from '../../src/domain/token-rows.js';
import { putChecked, type ShardFile, storeChecked, uploadShard, writeShardFiles } from '../../src/runner/shard-writer.js';
import { Stores } from '../../src/storage/index.js';
import { tempDir } from '../support/server.js';

const NOW = 1_700_000_000_000;
const UPLOADED_AT = NOW - 1000;
const tmp = tempDir();
afterAll(() => tmp.cleanup());

it('an upload started from a shard row listed before another upload of it ended changes nothing and fails nothing', async () => {
  const db = await openDb(join(tmp.dir, 'stale.db'));
  const out = join(tmp.dir, 'out');
  mkdirSync(out);
  const stores = new Stores({ forcePathStyle: false });
  const exec = (text: string, params: unknown[] = []) => db.write((w) => w.exec(text, params));
  try {
    await exec(
      `insert into runs (id, model, status, created_at, params, input, shard_size, output_uri, metadata, on_invalid_line, request_timeout_ms, max_attempts, updated_at, total, completed, shards_total)
       values ('run_a', 'm', 'in_progress', ?, '{}', '{"requests":1}', 2, ?, '{}', 'fail', 1000, 5, ?, 2, 2, 1)`,
      [NOW, `${pathToFileURL(out).href}/`, NOW],
    );
    await exec(`insert into shards (run_id, idx, first_seq, sample_count, terminal_count) values ('run_a', 0, 0, 2, 2)`);
    for (let i = 0; i < 2; i++) {
      await exec(`insert into samples (run_id, seq, shard_idx, custom_id, request, status) values ('run_a', ?, 0, ?, '{}', 'completed')`, [i, `s${i}`]);
    }
    // The finisher lists the shard as closed and open...
    const [listed] = await closedOpenShards(db, 'run_a', 8);
    expect(listed).toMatchObject({ idx: 0, status: 'open' });
    // ...while an upload of it already under way ends: its object written, the shard uploaded, its staging rows dropped.
    const body = '{"custom_id":"s0"}\n{"custom_id":"s1"}\n';
    writeFileSync(join(out, 'shard-00000.jsonl'), body);
    const sha256 = createHash('sha256').update(body).digest('hex');
    await exec(
      `update shards set status = 'uploaded', key = 'shard-00000.jsonl', bytes = ?, lines = 2, sha256 = ?, uploaded_at = ? where run_id = 'run_a' and idx = 0`,
      [body.length, sha256, UPLOADED_AT],
    );
    await exec(`delete from staging where run_id = 'run_a'`);
    const [uploaded] = await listRunShards(db, 'run_a');
    const run = (await getRun(db, 'run_a'))!;

    // The stale row is seen for what it is, before any sample is read or any object written.
    const deps = { db, clock: () => NOW, stores } as unknown as RunnerDeps;
    await expect(uploadShard(deps, run, listed)).resolves.toBe(false);
    // The shard is as the finished upload left it: no attempt, no error, its object and digest its own.
    const [after] = await listRunShards(db, 'run_a');
    expect(after).toEqual(uploaded);
    expect(after).toMatchObject({ status: 'uploaded', key: 'shard-00000.jsonl', sha256, uploadAttempts: 0, lastError: null, uploadedAt: UPLOADED_AT });
    expect(readdirSync(out)).toEqual(['shard-00000.jsonl']);
    expect(readFileSync(join(out, 'shard-00000.jsonl'), 'utf8')).toBe(body);
  } finally {
    stores.close();
    await closeDb(db);
  }
});

it('records the digest of the bytes stored, and refuses bytes read back that differ from the body, by one byte or in length', async () => {
  const out = join(tmp.dir, 'checked');
  mkdirSync(out);
  const stores = new Stores({ forcePathStyle: false });
  try {
    const store = stores.forUri(`${pathToFileURL(out).href}/`);
    const body = Buffer.from('{"input_ids":[1,2,3],"loss_mask":[0,1,1]}\n');
    const digest = await putChecked(store, 'tokens/shard-00000.jsonl', body);
    expect(digest).toBe(
      createHash('sha256')
        .update(readFileSync(join(out, 'tokens/shard-00000.jsonl')))
        .digest('hex'),
    );
    // A store that hands back other bytes than it was given: the same length with one byte changed, or one byte short.
    const changed = (back: Buffer) => Buffer.concat([back.subarray(0, 5), Buffer.from([back[5]! ^ 1]), back.subarray(6)]);
    for (const alter of [changed, (back: Buffer) => back.subarray(1)]) {
      const faulty = { ...store, put: store.put.bind(store), get: async (key: string) => alter(await store.get(key)) } as typeof store;
      await expect(putChecked(faulty, 'tokens/shard-00001.jsonl', body)).rejects.toThrow(
        'verification of tokens/shard-00001.jsonl failed: the stored bytes differ',
      );
    }
    // The format's own check reads what came back.
    await expect(
      putChecked(store, 'shard-00002.jsonl', body, () => {
        throw new Error('0 rows read back');
      }),
    ).rejects.toThrow('0 rows read back');
  } finally {
    stores.close();
  }
});

it("writes a shard's text, failed lines and training rows at once, and returns only once every write has ended, failed or not", async () => {
  const out = join(tmp.dir, 'at-once');
  mkdirSync(out);
  const stores = new Stores({ forcePathStyle: false });
  try {
    const store = stores.forUri(`${pathToFileURL(out).href}/`);
    const rows = [1, 2].map((i) =>
      tokenRow({ customId: `s${i}`, sampleIndex: 0, turn: null, step: null, variant: null, split: null, finishReason: 'stop', flags: 0 }, [7, 8, 9], 2),
    );
    const files = { records: ['{"custom_id":"s1"}', '{"custom_id":"s2"}'], errors: ['{"custom_id":"s3"}'], tokenRows: rows };
    const shard = { idx: 3, split: null, key: null, errorsKey: null, tokensKey: null };
    // Each put is held until all three have started: written one after the other, this would never end.
    const started: string[] = [];
    let release!: () => void;
    const allStarted = new Promise<void>((r) => (release = r));
    const held = async (file: ShardFile) => {
      started.push(file.key);
      if (started.length === 3) release();
      await allStarted;
      await storeChecked(store, file);
    };
    const digested: Record<string, string>[] = [];
    const beforeStore = async (digests: Record<string, string>) => {
      // Told before any file is stored.
      expect(started).toEqual([]);
      digested.push(digests);
      return true;
    };
    const written = (await writeShardFiles(store, 'jsonl', shard, files, { beforeStore, put: held }))!;
    expect(started.sort()).toEqual(['shard-00003.errors.jsonl', 'shard-00003.jsonl', 'tokens/shard-00003.jsonl']);
    expect(written).toMatchObject({
      key: 'shard-00003.jsonl',
      lines: 2,
      errorsKey: 'shard-00003.errors.jsonl',
      errorsLines: 1,
      tokensKey: 'tokens/shard-00003.jsonl',
      tokensRows: 2,
    });
    expect(readFileSync(join(out, 'tokens/shard-00003.jsonl'), 'utf8').split('\n')[0]).toContain('"input_ids":[7,8,9],"loss_mask":[0,1,1]');
    // The digests told before are those of the files stored, and those the shard records.
    const digestOf = (key: string) =>
      createHash('sha256')
        .update(readFileSync(join(out, key)))
        .digest('hex');
    expect(digested).toEqual([Object.fromEntries(['shard-00003.jsonl', 'shard-00003.errors.jsonl', 'tokens/shard-00003.jsonl'].map((k) => [k, digestOf(k)]))]);
    expect([written.sha256, written.errorsSha256, written.tokensSha256]).toEqual(Object.values(digested[0]!));

    // The text's write fails at once; the training rows' write is still going. The failure is
    // thrown only after that write has ended, so nothing of this attempt is left writing when the
    // shard is written again.
    const ended: string[] = [];
    const failing = async (file: ShardFile) => {
      if (file.key === 'shard-00004.jsonl') throw new Error('the store refused the text');
      await new Promise((r) => setTimeout(r, 200));
      await storeChecked(store, file);
      ended.push(file.key);
    };
    await expect(writeShardFiles(store, 'jsonl', { ...shard, idx: 4 }, files, { put: failing })).rejects.toThrow('the store refused the text');
    expect(ended.sort()).toEqual(['shard-00004.errors.jsonl', 'tokens/shard-00004.jsonl']);
  } finally {
    stores.close();
  }
});

it('uploads a reopened shard again after an upload that stored some of its files and failed on another', async () => {
  const db = await openDb(join(tmp.dir, 'reopened.db'));
  const out = join(tmp.dir, 'reopened');
  mkdirSync(out);
  const stores = new Stores({ forcePathStyle: false });
  const exec = (text: string, params: unknown[] = []) => db.write((w) => w.exec(text, params));
  const stage = async (customId: string, content: string) => {
    const [{ id }] = (await db.write((w) => w.exec<{ id: number }>(`select id from samples where custom_id = ?`, [customId]))).rows;
    await exec(`insert into staging (sample_id, run_id, shard_idx, output) values (?, 'run_r', 0, ?)`, [
      id,
      JSON.stringify({ content, reasoning_content: null, model: 'm' }),
    ]);
  };
  try {
    await exec(
      `insert into runs (id, model, status, created_at, params, input, shard_size, output_uri, metadata, on_invalid_line, request_timeout_ms, max_attempts, updated_at, total, completed, failed, shards_total)
       values ('run_r', 'm', 'in_progress', ?, '{}', '{"requests":3}', 3, ?, '{}', 'fail', 1000, 5, ?, 3, 1, 2, 1)`,
      [NOW, `${pathToFileURL(out).href}/`, NOW],
    );
    await exec(`insert into shards (run_id, idx, first_seq, sample_count, terminal_count) values ('run_r', 0, 0, 3, 3)`);
    await exec(`insert into samples (run_id, seq, shard_idx, custom_id, request, status) values ('run_r', 0, 0, 's0', '{}', 'completed')`);
    for (const i of [1, 2]) {
      await exec(
        `insert into samples (run_id, seq, shard_idx, custom_id, request, status, error_code, error_message) values ('run_r', ?, 0, ?, '{}', 'failed', 'server_error', 'down')`,
        [i, `s${i}`],
      );
    }
    await stage('s0', 'zero');
    const deps = { db, clock: () => NOW, stores } as unknown as RunnerDeps;
    const upload = async (with_: RunnerDeps) => uploadShard(with_, (await getRun(db, 'run_r'))!, (await listRunShards(db, 'run_r'))[0]!);
    expect(await upload(deps)).toBe(true);

    // A retry answers s1: the shard opens again, s0's record now only in the file written above.
    await exec(`update samples set status = 'completed', error_code = null, error_message = null where custom_id = 's1'`);
    await stage('s1', 'one');
    await exec(`update shards set status = 'open', generation = generation + 1 where run_id = 'run_r'`);
    const [before] = await listRunShards(db, 'run_r');

    // Its next upload stores the text and fails on the errors file: the text at the shard's key is no longer the one it records.
    const real = stores.forUri(`${pathToFileURL(out).href}/`);
    const faulty = new Proxy(real, {
      get(target, name) {
        if (name === 'put')
          return async (key: string, body: Buffer) => {
            if (key === 'shard-00000.errors.jsonl') throw new Error('the store refused the errors');
            return target.put(key, body);
          };
        const value = Reflect.get(target, name);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
    const faultyDeps = { ...deps, stores: { forOutput: () => faulty } } as unknown as RunnerDeps;
    await expect(upload(faultyDeps)).rejects.toThrow('the store refused the errors');
    const textNow = createHash('sha256')
      .update(readFileSync(join(out, 'shard-00000.jsonl')))
      .digest('hex');
    expect(textNow).not.toBe(before!.sha256);

    // The upload after it takes that text for one of the shard's own, and writes the shard whole.
    expect(await upload(deps)).toBe(true);
    const lines = readFileSync(join(out, 'shard-00000.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.custom_id, l.content])).toEqual([
      ['s0', 'zero'],
      ['s1', 'one'],
    ]);
    const errors = readFileSync(join(out, 'shard-00000.errors.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(errors.map((l) => l.custom_id)).toEqual(['s2']);
    const [after] = await listRunShards(db, 'run_r');
    expect(after).toMatchObject({ status: 'uploaded', lines: 2, errorsLines: 1, pendingDigests: null });
    expect(after!.sha256).toBe(
      createHash('sha256')
        .update(readFileSync(join(out, 'shard-00000.jsonl')))
        .digest('hex'),
    );

    // An upload that is stale by the time it records its digests (the shard reopened again) records and stores nothing.
    await exec(`update shards set status = 'open', generation = generation + 1 where run_id = 'run_r'`);
    expect(await recordPendingDigests(db, 'run_r', after!, { 'shard-00000.jsonl': 'a digest' })).toBe(false);
    expect((await listRunShards(db, 'run_r'))[0]).toMatchObject({ pendingDigests: null });
    // Other bytes at the shard's key are still refused: neither the file recorded nor one an upload left there.
    writeFileSync(join(out, 'shard-00000.jsonl'), '{"custom_id":"s0","content":"not what regen wrote"}\n');
    await expect(upload(deps)).rejects.toThrow('shard-00000.jsonl no longer holds the file this shard wrote');
  } finally {
    stores.close();
    await closeDb(db);
  }
});
