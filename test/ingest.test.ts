import { createReadStream, createWriteStream, readFileSync, statSync } from 'node:fs';
import { once } from 'node:events';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';

const tmp = tempDir('regen-ingest-test-');
const servers: ServerProcess[] = [];

afterAll(async () => {
  for (const s of servers) await s.kill('SIGKILL');
  tmp.cleanup();
});

/** Writes `n` native lines of about 300 bytes each, without holding the file in memory. */
async function writeInput(path: string, n: number): Promise<number> {
  const out = createWriteStream(path);
  const pad = 'lorem ipsum dolor sit amet '.repeat(6);
  for (let i = 0; i < n; i++) {
    const line = JSON.stringify({
      custom_id: `c-${i}`,
      messages: [
        { role: 'system', content: 'be helpful' },
        { role: 'user', content: `question ${i}: ${pad}` },
      ],
    });
    if (!out.write(line + '\n')) await once(out, 'drain');
  }
  out.end();
  await once(out, 'finish');
  return statSync(path).size;
}

/** Uploads by streaming the file as the request body, as a client with a huge file would. */
async function uploadStreaming(base: string, path: string): Promise<{ id: string; bytes: number }> {
  const res = await fetch(`${base}/v1/files?filename=big.jsonl`, {
    method: 'POST',
    headers: { 'content-type': 'application/jsonl' },
    body: createReadStream(path) as unknown as BodyInit,
    duplex: 'half',
  } as RequestInit);
  const body = await res.json();
  expect(res.status, JSON.stringify(body)).toBe(201);
  return body;
}

async function createAndWaitQueued(base: string, fileId: string): Promise<any> {
  const created = await call(base, '/v1/runs', { method: 'POST', json: { model: 'qwen', input: { file_id: fileId } } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return waitFor(
    `run ${created.body.id} queued`,
    async () => {
      const r = await call(base, `/v1/runs/${created.body.id}`);
      if (r.body.status === 'failed') throw new Error(`run failed: ${r.body.status_reason}`);
      return r.body.status === 'queued' ? r.body : undefined;
    },
    110_000,
    250,
  );
}

/** Peak resident memory of a process so far, in bytes. */
function peakRss(pid: number): number {
  const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error('no VmHWM in /proc status');
  return Number(m[1]) * 1024;
}

const MB = 1024 * 1024;

/** A fresh `regen serve` process (runner on, no endpoints) ingests `lines` lines; returns its peak RSS. */
async function ingestInFreshServer(lines: number) {
  const dataDir = join(tmp.dir, `data-${lines}`);
  const input = join(tmp.dir, `input-${lines}.jsonl`);
  const bytes = await writeInput(input, lines);
  const server = await spawnServer(dataDir);
  servers.push(server);
  const file = await uploadStreaming(server.url, input);
  expect(file.bytes).toBe(bytes);
  const run = await createAndWaitQueued(server.url, file.id);
  return { server, run, bytes, peak: peakRss(server.proc.pid!) };
}

describe('ingestion of large inputs', () => {
  let small: Awaited<ReturnType<typeof ingestInFreshServer>>;

  it('a streamed 100K-line upload becomes 100K samples in 100 shards', async () => {
    small = await ingestInFreshServer(100_000);
    const { server, run } = small;
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
    const dataDir = join(tmp.dir, 'data-crash');
    const first = await spawnServer(dataDir);
    servers.push(first);
    const file = await uploadStreaming(first.url, join(tmp.dir, 'input-100000.jsonl'));
    const created = await call(first.url, '/v1/runs', { method: 'POST', json: { model: 'qwen', shard_size: 3000, input: { file_id: file.id } } });
    expect(created.status).toBe(201);
    await first.kill('SIGKILL');

    const second = await spawnServer(dataDir);
    servers.push(second);
    const run = await waitFor(
      'the run queued after restart',
      async () => {
        const r = await call(second.url, `/v1/runs/${created.body.id}`);
        return r.body.status === 'queued' ? r.body : undefined;
      },
      110_000,
      250,
    );
    expect(run.request_counts).toMatchObject({ total: 100_000, pending: 100_000 });
    expect(run.shards.total).toBe(34);
    const shards = (await call(second.url, `/v1/runs/${run.id}/shards?limit=100`)).body.data;
    expect(shards.reduce((n: number, s: any) => n + s.samples, 0)).toBe(100_000);
    expect(shards.at(-1).samples).toBe(100_000 - 33 * 3000);
    const last = await call(second.url, `/v1/runs/${run.id}/samples?limit=5&after=c-99998`);
    expect(last.body.data.map((s: any) => s.custom_id)).toEqual(['c-99999']);
    await second.kill('SIGKILL');
  });

  it('memory stays flat: the peak RSS for a 500K-line file is within 60 MB of the 100K one', async () => {
    expect(small, 'the 100K ingestion ran first').toBeDefined();
    // The first server is done; free its share of the machine before measuring the next.
    await small.server.kill('SIGKILL');
    const big = await ingestInFreshServer(500_000);
    expect(big.run.request_counts.total).toBe(500_000);
    expect(big.run.shards.total).toBe(500);
    const growth = big.peak - small.peak;
    // Logged so a regression shows its size, not only that it failed.
    console.info(
      `ingest peak RSS: 100K lines (${(small.bytes / MB).toFixed(0)} MB) → ${(small.peak / MB).toFixed(0)} MB; ` +
        `500K lines (${(big.bytes / MB).toFixed(0)} MB) → ${(big.peak / MB).toFixed(0)} MB`,
    );
    // The file grows by ~110 MB; reading it whole would grow the peak by more than that. The bound
    // leaves room for the garbage collector's timing, which moves the peak by up to ±35 MB between
    // two runs of the same input (seen on Node 24; less on 20).
    expect(big.bytes - small.bytes).toBeGreaterThan(100 * MB);
    expect(growth).toBeLessThan(60 * MB);
  });
});
