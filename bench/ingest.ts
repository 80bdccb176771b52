import { createReadStream, statSync } from 'node:fs';
import { join } from 'node:path';
import { openDb, closeDb, sqliteClient } from '../src/db/client.js';
import { spawnServer, tempDir } from '../test/support/server.js';
import { json, memoryOf, promptLine, scaled, until, writePrompts, type Figure } from './support.js';

/** Raw better-sqlite3 inserts of the rows regen stores for n prompts: the ceiling for ingestion. */
async function rawInsert(dir: string, n: number): Promise<number> {
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
  for (let i = 0; i < n; i += 5000) batch(i, Math.min(n, i + 5000));
  const seconds = (performance.now() - t0) / 1000;
  await closeDb(db);
  return n / seconds;
}

export async function benchIngest(): Promise<Figure[]> {
  const n = scaled(1_000_000, 1000);
  const tmp = tempDir('regen-bench-ingest-');
  try {
    const file = join(tmp.dir, 'prompts.jsonl');
    await writePrompts(file, n);
    const server = await spawnServer(join(tmp.dir, 'data'));
    let regenRate: number;
    let peak: number;
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
      regenRate = done.request_counts.total / ((performance.now() - t0) / 1000);
      peak = memoryOf(server.proc.pid!).peakMiB;
    } finally {
      await server.kill('SIGTERM');
    }
    const rawRate = await rawInsert(tmp.dir, n);
    const sizeMiB = statSync(file).size / 1048576;
    return [
      {
        part: 'ingest',
        figure: `prompts/s, ${n.toLocaleString('en')}-line file (${sizeMiB.toFixed(0)} MiB), upload → queued`,
        regen: regenRate,
        baseline: rawRate,
        unit: 'prompts/s',
        ratio: regenRate / rawRate,
        target: '≥ 0.5 × raw inserts',
        ok: regenRate / rawRate >= 0.5,
      },
      {
        part: 'ingest',
        figure: 'server peak RSS during ingest',
        regen: peak,
        baseline: null,
        unit: 'MiB',
        ratio: null,
        target: '≤ 256 MiB',
        ok: peak <= 256,
      },
    ];
  } finally {
    tmp.cleanup();
  }
}
