import { createReadStream, statSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import { openDb, closeDb, sqliteClient } from '../src/db/client.js';
import { createTestDatabase } from '../test/support/pg.js';
import { spawnServer, tempDir } from '../test/support/server.js';
import { json, memoryOf, promptLine, scaled, until, writePrompts, type Figure } from './support.js';

// Each store's ingest against the fastest plain insert of the same rows into it, side by side: raw
// better-sqlite3 inserts for SQLite, raw multi-row INSERTs through pg for PostgreSQL.

/** Lines a raw batch inserts: the batch regen's own ingest commits (services/runs/ingest.ts). */
const RAW_BATCH = 1000;

/** Raw better-sqlite3 inserts of the rows regen stores for n prompts: the ceiling for ingestion. */
async function rawSqlite(dir: string, n: number): Promise<number> {
  const db = await openDb(join(dir, 'raw.db'));
  const sqlite = sqliteClient(db);
  const insert = sqlite.prepare(`insert into samples (run_id, seq, shard_idx, custom_id, status, request) values (?, ?, ?, ?, 'pending', ?)`);
  const batch = sqlite.transaction((from: number, to: number) => {
    for (let i = from; i < to; i++) {
      const line = JSON.parse(promptLine(i)) as { custom_id: string; messages: unknown };
      insert.run('run_raw', i, Math.floor(i / 1000), line.custom_id, JSON.stringify({ messages: line.messages }));
    }
  });
  const t0 = performance.now();
  for (let i = 0; i < n; i += RAW_BATCH) batch(i, Math.min(n, i + RAW_BATCH));
  const seconds = (performance.now() - t0) / 1000;
  await closeDb(db);
  return n / seconds;
}

/** Raw multi-row INSERTs through pg, a statement of RAW_BATCH rows at a time, into the database regen migrated. */
async function rawPg(url: string, n: number): Promise<number> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const t0 = performance.now();
    for (let from = 0; from < n; from += RAW_BATCH) {
      const values: unknown[] = [];
      const rows: string[] = [];
      for (let i = from; i < Math.min(n, from + RAW_BATCH); i++) {
        const line = JSON.parse(promptLine(i)) as { custom_id: string; messages: unknown };
        const p = values.length;
        rows.push(`($${p + 1}, $${p + 2}, $${p + 3}, $${p + 4}, 'pending', $${p + 5})`);
        values.push('run_raw', i, Math.floor(i / 1000), line.custom_id, JSON.stringify({ messages: line.messages }));
      }
      await client.query(`insert into samples (run_id, seq, shard_idx, custom_id, status, request) values ${rows.join(', ')}`, values);
    }
    return n / ((performance.now() - t0) / 1000);
  } finally {
    await client.end();
  }
}

/** Upload → queued through regen's API on a fresh server; its rate and peak RSS. */
export async function regenIngest(dataDir: string, file: string, env: Record<string, string>): Promise<{ rate: number; peak: number }> {
  const server = await spawnServer(dataDir, env);
  try {
    const t0 = performance.now();
    const res = await fetch(`${server.url}/v1/files?filename=prompts.jsonl`, {
      method: 'POST',
      headers: { 'content-type': 'application/jsonl' },
      body: createReadStream(file) as unknown as BodyInit,
      duplex: 'half',
    } as RequestInit);
    const uploaded = (await res.json()) as { id: string };
    const run = await json<{ id: string }>(server.url, '/v1/runs', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'bench', input: { file_id: uploaded.id } }),
    });
    const done = await until(
      'the run to be queued',
      async () => {
        const r = await json<{ status: string; request_counts: { total: number } }>(server.url, `/v1/runs/${run.id}`);
        if (r.status === 'failed') throw new Error('ingest failed');
        return r.status === 'queued' ? r : undefined;
      },
      600_000,
    );
    return { rate: done.request_counts.total / ((performance.now() - t0) / 1000), peak: memoryOf(server.proc.pid!).peakMiB };
  } finally {
    await server.kill('SIGTERM');
  }
}

export async function benchIngest(): Promise<Figure[]> {
  // The goal is set at 200,000 lines; BENCH_SCALE=5 makes it the million of earlier measurements.
  const n = scaled(200_000, 1000);
  const tmp = tempDir('regen-bench-ingest-');
  const database = await createTestDatabase('bench_ingest');
  try {
    const file = join(tmp.dir, 'prompts.jsonl');
    await writePrompts(file, n);
    const sqlite = await regenIngest(join(tmp.dir, 'data'), file, {});
    const rawSqliteRate = await rawSqlite(tmp.dir, n);
    const onPg = await regenIngest(join(tmp.dir, 'data-pg'), file, { REGEN_DATABASE_URL: database.url });
    const rawPgRate = await rawPg(database.url, n);
    const sizeMiB = statSync(file).size / 1048576;
    const lines = `${n.toLocaleString('en')}-line file (${sizeMiB.toFixed(0)} MiB), upload → queued`;
    return [
      {
        part: 'ingest',
        figure: `prompts/s on SQLite, ${lines}, against raw better-sqlite3 inserts`,
        regen: sqlite.rate,
        baseline: rawSqliteRate,
        unit: 'prompts/s',
        ratio: sqlite.rate / rawSqliteRate,
        target: '≥ 0.5 × raw inserts',
        ok: sqlite.rate / rawSqliteRate >= 0.5,
      },
      {
        part: 'ingest',
        figure: `prompts/s on PostgreSQL, ${lines}, against raw multi-row INSERTs through pg`,
        regen: onPg.rate,
        baseline: rawPgRate,
        unit: 'prompts/s',
        ratio: onPg.rate / rawPgRate,
        target: '≥ 0.5 × raw inserts',
        ok: onPg.rate / rawPgRate >= 0.5,
      },
      {
        part: 'ingest',
        figure: 'server peak RSS during ingest (SQLite)',
        regen: sqlite.peak,
        baseline: null,
        unit: 'MiB',
        ratio: null,
        target: '≤ 256 MiB',
        ok: sqlite.peak <= 256,
      },
    ];
  } finally {
    await database.drop();
    tmp.cleanup();
  }
}
