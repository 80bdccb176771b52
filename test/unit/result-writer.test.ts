import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { join } from 'node:path';
import { closeDb, openDb, type Db } from '../../src/db/client.js';
import { registerReplica } from '../../src/db/replicas.js';
import { requeueRunSamples } from '../../src/db/requeue.js';
import { claimSamples, readClaim, releaseRunLeases } from '../../src/db/samples.js';
import { flagBit } from '../../src/domain/flags.js';
import { makeLogger } from '../../src/logger.js';
import { ResultWriter, type FlushReport } from '../../src/runner/results.js';
import { createTestDatabase, describePg, type TestDatabase } from '../support/pg.js';
import { tempDir } from '../support/server.js';

// Every column a distinct value, so that two swapped columns show.
const usage = { prompt_tokens: 11, completion_tokens: 20, reasoning_tokens: 5, cached_tokens: 3 };
const NOW = 1_700_000_000_000;

/** A run of `n` pending samples, and `owner` a replica (on PostgreSQL only a live replica may claim). */
async function seed(db: Db, n: number, shardSize: number, owner = 'me'): Promise<void> {
  if (db.dialect === 'pg') await registerReplica(db, { owner, pid: process.pid, hostname: 'test' });
  const exec = (text: string, params: unknown[]) => db.write((w) => w.exec(text, params));
  await exec(
    `insert into runs (id, model, status, created_at, params, input, shard_size, output_uri, metadata, on_invalid_line, request_timeout_ms, max_attempts, updated_at, total, pending, shards_total)
     values ('run_a', 'm', 'in_progress', ?, '{}', '{"requests":1}', ?, 'file:///tmp/x/', '{}', 'fail', 1000, 5, ?, ?, ?, ?)`,
    [NOW, shardSize, NOW, n, n, Math.ceil(n / shardSize)],
  );
  for (let s = 0; s * shardSize < n; s++) {
    await exec(`insert into shards (run_id, idx, first_seq, sample_count) values ('run_a', ?, ?, ?)`, [
      s,
      s * shardSize,
      Math.min(shardSize, n - s * shardSize),
    ]);
  }
  for (let i = 0; i < n; i++) {
    await exec(`insert into samples (run_id, seq, shard_idx, custom_id, request) values ('run_a', ?, ?, ?, '{"messages":[]}')`, [
      i,
      Math.floor(i / shardSize),
      `c${i}`,
    ]);
  }
}

/** A writer for owner `me` on the fixed clock, and the reports of its commits. */
function writerOn(db: Db): { w: ResultWriter; reports: FlushReport[] } {
  const reports: FlushReport[] = [];
  return {
    w: new ResultWriter(
      db,
      'me',
      makeLogger('silent'),
      (r) => reports.push(r),
      () => NOW,
    ),
    reports,
  };
}

async function rows(db: Db, text: string): Promise<Record<string, unknown>[]> {
  return (await db.exec<Record<string, unknown>>(text)).rows;
}

const counters = async (db: Db) =>
  (
    await rows(
      db,
      `select pending, in_progress as "inProgress", completed, failed, cancelled, flagged, flag_empty_content as empty, completion_tokens as tokens, dropped_results as dropped from runs`,
    )
  )[0];

/** The same tests on each store: SQLite updates sample by sample, PostgreSQL a statement per kind of outcome. */
function writerTests(store: 'sqlite' | 'pg') {
  const tmp = tempDir();
  let db: Db;
  let database: TestDatabase | null = null;
  const open = async (name: string) => {
    if (store === 'sqlite') return openDb(join(tmp.dir, `${name}.db`));
    database = await createTestDatabase(`writer_${name}`);
    return openDb(database.url);
  };
  afterAll(() => tmp.cleanup());
  afterEach(async () => {
    await closeDb(db);
    await database?.drop();
    database = null;
  });

  it('reads a claim again by its owner and lease expiry: its samples, in the order it returned them, and no others', async () => {
    db = await open('reclaim');
    await seed(db, 6, 3);
    const claim = (leaseExpiresAt: number, limit: number) =>
      claimSamples(db, { runId: 'run_a', owner: 'me', now: NOW, leaseExpiresAt, limit, order: 'input', window: 0 });
    const first = await claim(NOW + 1000, 2);
    const second = await claim(NOW + 1001, 3);
    // No more than asked for: on PostgreSQL a claim's subquery, rescanned per row, once leased them all.
    expect(first.map((c) => c.id)).toHaveLength(2);
    expect(second.map((c) => c.id)).toHaveLength(3);
    expect(await readClaim(db, { runId: 'run_a', owner: 'me', leaseExpiresAt: NOW + 1000 })).toEqual(first);
    expect(await readClaim(db, { runId: 'run_a', owner: 'me', leaseExpiresAt: NOW + 1001 })).toEqual(second);
    // A claim not made, another owner's, a sample answered since: none of them is found.
    expect(await readClaim(db, { runId: 'run_a', owner: 'me', leaseExpiresAt: NOW + 1002 })).toEqual([]);
    expect(await readClaim(db, { runId: 'run_a', owner: 'other', leaseExpiresAt: NOW + 1000 })).toEqual([]);
    const { w } = writerOn(db);
    w.add({ kind: 'cancelled', sampleId: first[0].id, runId: 'run_a', shardIdx: first[0].shardIdx, endpointId: null });
    await w.flush();
    expect(await readClaim(db, { runId: 'run_a', owner: 'me', leaseExpiresAt: NOW + 1000 })).toEqual(first.slice(1));
    await releaseRunLeases(db, 'run_a');
    expect(await readClaim(db, { runId: 'run_a', owner: 'me', leaseExpiresAt: NOW + 1001 })).toEqual([]);
  });

  it("commits a conversation's turn with its sample moved on, claims the conversation before new ones, with its history", async () => {
    db = await open('turns');
    await seed(db, 4, 4);
    const exec = (text: string) => db.write((w) => w.exec(text, []));
    await exec(`update runs set regenerate = 'all_assistant', turns_total = 8`);
    await exec(`update samples set turn = 0, request = '{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}'`);
    const claim = (limit: number, at: number) =>
      claimSamples(db, { runId: 'run_a', owner: 'me', now: NOW, leaseExpiresAt: NOW + at, limit, order: 'input', window: 0 });
    const [c0, c1] = await claim(2, 1000);
    expect([c0.turn, c1.turn]).toEqual([0, 0]);
    const { w } = writerOn(db);
    const base = (c: typeof c0) => ({ sampleId: c.id, runId: 'run_a', shardIdx: c.shardIdx, endpointId: 'e1' });
    const record = (idx: number) => ({
      idx,
      step: 0,
      toolCalls: null,
      content: `reply ${idx}`,
      reasoningContent: `thought ${idx}`,
      finishReason: 'stop',
      usage,
      endpointId: 'e1',
      latencyMs: 9,
      attempts: 1,
      flags: 0,
    });
    w.add({ ...base(c1), kind: 'turn', turn: record(0), flags: 0 });
    // A turn the sample is no longer at (answered twice, say) changes nothing.
    w.add({ ...base(c0), kind: 'turn', turn: record(1), flags: 0 });
    await w.flush();
    w.add({ ...base(c0), kind: 'release' });
    await w.flush();
    expect(
      await rows(db, `select custom_id, status, turn, attempts, affinity_endpoint_id as affinity from samples where custom_id in ('c0', 'c1') order by seq`),
    ).toEqual([
      { custom_id: 'c0', status: 'pending', turn: 0, attempts: 0, affinity: null },
      { custom_id: 'c1', status: 'pending', turn: 1, attempts: 0, affinity: 'e1' },
    ]);
    expect(await rows(db, `select sample_id, idx, content from sample_turns`)).toEqual([{ sample_id: c1.id, idx: 0, content: 'reply 0' }]);
    expect((await rows(db, `select turns_completed as n, prompt_tokens as p, dropped_results as d from runs`))[0]).toEqual({
      n: 1,
      p: usage.prompt_tokens,
      d: 1,
    });

    // The conversation under way goes first, ahead of samples earlier in the input, with the turn it answered.
    const [next] = await claim(1, 1001);
    expect(next).toMatchObject({ id: c1.id, turn: 1, attempts: 1, affinityEndpointId: 'e1' });
    expect(next.history).toEqual([record(0)]);
    expect(await readClaim(db, { runId: 'run_a', owner: 'me', leaseExpiresAt: NOW + 1001 })).toEqual([next]);

    w.add({
      ...base(next),
      kind: 'completed',
      usage,
      finishReason: 'stop',
      latencyMs: 9,
      flags: 0,
      chars: { reasoning: 1, content: 1 },
      output: '{}',
      at: NOW,
      turn: record(1),
    });
    await w.flush();
    expect(await rows(db, `select status, turn, affinity_endpoint_id as affinity from samples where id = ${next.id}`)).toEqual([
      { status: 'completed', turn: 1, affinity: 'e1' },
    ]);
    expect((await rows(db, `select count(*) as n from sample_turns where sample_id = ${next.id}`)).map((r) => Number(r.n))).toEqual([2]);
    expect((await rows(db, `select turns_completed as n, completed from runs`))[0]).toEqual({ n: 2, completed: 1 });
  });

  it('retries a conversation from its first flagged or failed turn, keeping the turns before it', async () => {
    db = await open('rewind');
    await seed(db, 2, 2);
    const exec = (text: string, params: unknown[] = []) => db.write((w) => w.exec(text, params));
    const [flagged, failed] = (await rows(db, `select id from samples order by seq`)).map((r) => Number(r.id));
    // c0 completed with its turn 1 of 3 flagged; c1 failed at its turn 2, its turns 0 and 1 answered.
    await exec(`update runs set regenerate = 'all_assistant', pending = 0, completed = 1, failed = 1, flagged = 1, flag_truncated = 1,
      turns_total = 6, turns_completed = 5, turns_failed = 1`);
    await exec(`update samples set status = 'completed', turn = 2, flags = ? where id = ?`, [flagBit('truncated'), flagged]);
    await exec(`update samples set status = 'failed', turn = 2, error_code = 'server_error' where id = ?`, [failed]);
    await exec(`update shards set terminal_count = 2`);
    for (const [id, idx, flags] of [
      [flagged, 0, 0],
      [flagged, 1, flagBit('truncated')],
      [flagged, 2, 0],
      [failed, 0, 0],
      [failed, 1, 0],
    ]) {
      await exec(
        `insert into sample_turns (sample_id, idx, run_id, content, prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens, latency_ms, attempts, flags)
         values (?, ?, 'run_a', 'r', 1, 1, 0, 0, 1, 1, ?)`,
        [id, idx, flags],
      );
    }
    expect(await requeueRunSamples(db, 'run_a', 'flagged', NOW)).toBe(1);
    expect(await requeueRunSamples(db, 'run_a', 'failed', NOW)).toBe(1);
    expect(await rows(db, `select status, turn, flags from samples order by seq`)).toEqual([
      { status: 'pending', turn: 1, flags: 0 },
      { status: 'pending', turn: 2, flags: 0 },
    ]);
    const kept = await rows(db, `select sample_id, idx from sample_turns order by sample_id, idx`);
    expect(kept.map((r) => [Number(r.sample_id), r.idx])).toEqual([
      [flagged, 0],
      [failed, 0],
      [failed, 1],
    ]);
    expect((await rows(db, `select pending, turns_completed as done, turns_failed as lost from runs`))[0]).toEqual({ pending: 2, done: 3, lost: 0 });
  });

  it('gives a shard reopened by a retry a fresh upload budget: the failures before its last upload are not counted again', async () => {
    db = await open('reopen');
    await seed(db, 2, 2);
    const exec = (text: string, params: unknown[] = []) => db.write((w) => w.exec(text, params));
    const [, lost] = (await rows(db, `select id from samples order by seq`)).map((r) => Number(r.id));
    await exec(`update runs set status = 'completed', pending = 0, completed = 1, failed = 1`);
    await exec(`update samples set status = 'completed'`);
    await exec(`update samples set status = 'failed', error_code = 'server_error' where id = ?`, [lost]);
    // Written after four failed attempts: the row keeps the count and the last error.
    await exec(
      `update shards set terminal_count = 2, status = 'uploaded', upload_attempts = 4, last_error = 'upload failed: the store timed out; retrying in 8 s'`,
    );
    expect(await requeueRunSamples(db, 'run_a', 'failed', NOW)).toBe(1);
    expect(
      await rows(db, `select status, generation, terminal_count as "terminalCount", upload_attempts as attempts, last_error as "lastError" from shards`),
    ).toEqual([{ status: 'open', generation: 1, terminalCount: 1, attempts: 0, lastError: null }]);
  });

  it('commits a batch of outcomes in one transaction, keeps the counters equal to a recount, and reports closed shards', async () => {
    db = await open('a');
    await seed(db, 6, 3);
    const claimed = await claimSamples(db, { runId: 'run_a', owner: 'me', now: NOW, leaseExpiresAt: NOW + 1000, limit: 10, order: 'input', window: 0 });
    expect(claimed.map((c) => c.attempts)).toEqual([1, 1, 1, 1, 1, 1]);
    expect(await counters(db)).toMatchObject({ pending: 0, inProgress: 6 });
    const { w, reports } = writerOn(db);
    const base = (i: number) => ({ sampleId: claimed[i].id, runId: 'run_a', shardIdx: claimed[i].shardIdx, endpointId: null });
    const completed = (i: number, flags = 0) => ({
      ...base(i),
      kind: 'completed' as const,
      usage,
      finishReason: 'stop',
      latencyMs: 7,
      flags,
      chars: { reasoning: 13, content: 17 },
      output: `{"line":${i}}`,
      at: NOW + i,
    });
    w.add(completed(0));
    w.add(completed(1, flagBit('empty_content')));
    w.add({ ...base(2), kind: 'failed', error: { code: 'invalid_request', message: 'too long', status: 400 }, at: NOW });
    w.add({
      ...base(3),
      kind: 'retry',
      availableAt: NOW + 500,
      usage: null,
      qualityRetry: false,
      serverFault: true,
      error: { code: 'server_error', message: 'x', status: 500 },
    });
    w.add({ ...base(4), kind: 'release' });
    w.add({ ...base(5), kind: 'cancelled' });
    await w.flush();
    // A second answer for a sample already terminal changes nothing and is counted as dropped.
    w.add(completed(0));
    await w.flush();
    expect(reports).toHaveLength(2);
    expect(reports[0].dropped).toBe(0);
    expect(reports[0].closedShards).toEqual([{ runId: 'run_a', idx: 0 }]);
    expect(reports[0].runs.get('run_a')).toEqual({ completed: 2, tokens: 40 });
    expect(reports[1].dropped).toBe(1);
    expect(reports[1].runs.get('run_a')).toEqual({ completed: 0, tokens: 0 });
    expect(await counters(db)).toEqual({ pending: 2, inProgress: 0, completed: 2, failed: 1, cancelled: 1, flagged: 1, empty: 1, tokens: 40, dropped: 1 });
    const recount = await rows(db, `select status, count(*) as n from samples group by status order by status`);
    expect(recount).toEqual([
      { status: 'cancelled', n: 1 },
      { status: 'completed', n: 2 },
      { status: 'failed', n: 1 },
      { status: 'pending', n: 2 },
    ]);
    // The release refunded its attempt; the server's fault refunded it too, counted the fault, and waits out its backoff.
    const attempts = await rows(
      db,
      `select custom_id, attempts, server_faults as faults, available_at as at from samples where status = 'pending' order by seq`,
    );
    expect(attempts).toEqual([
      { custom_id: 'c3', attempts: 0, faults: 1, at: NOW + 500 },
      { custom_id: 'c4', attempts: 0, faults: 0, at: 0 },
    ]);
    // Each column where it belongs: the answered and failed samples, and the staged lines.
    const answered = await rows(
      db,
      `select custom_id, endpoint_id, finish_reason, prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens, latency_ms, flags,
         reasoning_chars, content_chars, completed_at, error_code, error_message, error_status, lease_owner
       from samples where status in ('completed', 'failed') order by seq`,
    );
    const done = { endpoint_id: null, finish_reason: 'stop', prompt_tokens: 11, completion_tokens: 20, reasoning_tokens: 5, cached_tokens: 3, latency_ms: 7 };
    const none = { error_code: null, error_message: null, error_status: null, lease_owner: null };
    expect(answered).toEqual([
      { custom_id: 'c0', ...done, flags: 0, reasoning_chars: 13, content_chars: 17, completed_at: NOW, ...none },
      { custom_id: 'c1', ...done, flags: flagBit('empty_content'), reasoning_chars: 13, content_chars: 17, completed_at: NOW + 1, ...none },
      {
        custom_id: 'c2',
        endpoint_id: null,
        finish_reason: null,
        prompt_tokens: null,
        completion_tokens: null,
        reasoning_tokens: null,
        cached_tokens: null,
        latency_ms: null,
        flags: 0,
        reasoning_chars: null,
        content_chars: null,
        completed_at: NOW,
        error_code: 'invalid_request',
        error_message: 'too long',
        error_status: 400,
        lease_owner: null,
      },
    ]);
    expect(await rows(db, `select sample_id, run_id, shard_idx, output from staging order by sample_id`)).toEqual([
      { sample_id: claimed[0].id, run_id: 'run_a', shard_idx: 0, output: '{"line":0}' },
      { sample_id: claimed[1].id, run_id: 'run_a', shard_idx: 0, output: '{"line":1}' },
    ]);
    const retried = await rows(db, `select error_code, error_message, error_status, quality_retries from samples where custom_id = 'c3'`);
    expect(retried).toEqual([{ error_code: 'server_error', error_message: 'x', error_status: 500, quality_retries: 0 }]);
    await w.close();
  });

  it('drops the outcomes of leases another owner holds, and recovery gives every lease back', async () => {
    db = await open('b');
    await seed(db, 4, 4, 'old-process');
    const claimed = await claimSamples(db, {
      runId: 'run_a',
      owner: 'old-process',
      now: NOW,
      leaseExpiresAt: NOW + 1000,
      limit: 10,
      order: 'input',
      window: 0,
    });
    const { w, reports } = writerOn(db);
    w.add({ sampleId: claimed[0].id, runId: 'run_a', shardIdx: 0, endpointId: null, kind: 'cancelled' });
    await w.flush();
    expect(reports[0].dropped).toBe(1);
    expect(await releaseRunLeases(db, 'run_a')).toBe(4);
    expect(await counters(db)).toMatchObject({ pending: 4, inProgress: 0, dropped: 1 });
    expect(await rows(db, `select max(attempts) as a from samples`)).toEqual([{ a: 0 }]);
    await w.close();
  });

  it('a batch naming a sample twice applies the first outcome and drops the second', async () => {
    db = await open('c');
    await seed(db, 3, 3);
    const claimed = await claimSamples(db, { runId: 'run_a', owner: 'me', now: NOW, leaseExpiresAt: NOW + 1000, limit: 10, order: 'input', window: 0 });
    const { w, reports } = writerOn(db);
    const base = (i: number) => ({ sampleId: claimed[i].id, runId: 'run_a', shardIdx: 0, endpointId: null });
    w.add({ ...base(0), kind: 'cancelled' });
    w.add({ ...base(0), kind: 'release' });
    w.add({ ...base(1), kind: 'release' });
    await w.flush();
    expect(reports[0].dropped).toBe(1);
    expect(await counters(db)).toMatchObject({ pending: 1, inProgress: 1, cancelled: 1, dropped: 1 });
    expect(await rows(db, `select custom_id, status from samples order by seq`)).toEqual([
      { custom_id: 'c0', status: 'cancelled' },
      { custom_id: 'c1', status: 'pending' },
      { custom_id: 'c2', status: 'in_progress' },
    ]);
    await w.close();
  });
}

describe('the result writer on a temporary SQLite file', () => writerTests('sqlite'));
await describePg('the result writer on a temporary PostgreSQL database', () => writerTests('pg'));
