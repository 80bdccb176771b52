import { createReadStream, createWriteStream, statSync } from 'node:fs';
import { once } from 'node:events';
import { join } from 'node:path';
import { expect } from 'vitest';
import { peakRssMiB } from './faults.js';
import { call, spawnServer, waitFor, type ServerProcess } from './server.js';

// What the ingestion tests share: large inputs written and uploaded as streams, and a server
// process whose memory can be read.

/** Writes `n` native lines of about 300 bytes each, without holding the file in memory. */
export async function writeInput(path: string, n: number): Promise<number> {
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
export async function uploadStreaming(base: string, path: string): Promise<{ id: string; bytes: number }> {
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

/** Polls the run until it is queued (its validation done); fails at once if it failed. */
export function waitQueued(base: string, runId: string): Promise<any> {
  return waitFor(
    `run ${runId} queued`,
    async () => {
      const r = await call(base, `/v1/runs/${runId}`);
      if (r.body.status === 'failed') throw new Error(`run failed: ${r.body.status_reason}`);
      return r.body.status === 'queued' ? r.body : undefined;
    },
    110_000,
    250,
  );
}

async function createAndWaitQueued(base: string, fileId: string): Promise<any> {
  const created = await call(base, '/v1/runs', { method: 'POST', json: { model: 'qwen', input: { file_id: fileId } } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return waitQueued(base, created.body.id);
}

export const MB = 1024 * 1024;

export interface Ingested {
  server: ServerProcess;
  run: any;
  /** The input's size in bytes. */
  bytes: number;
  /** The server's peak resident memory once the run is queued, in bytes. */
  peak: number;
}

/** A fresh `regen serve` process (runner on, no endpoints) in `dir` ingests `lines` lines; returns its peak RSS. */
export async function ingestInFreshServer(dir: string, lines: number, servers: ServerProcess[]): Promise<Ingested> {
  const input = join(dir, `input-${lines}.jsonl`);
  const bytes = await writeInput(input, lines);
  const server = await spawnServer(join(dir, `data-${lines}`));
  servers.push(server);
  const file = await uploadStreaming(server.url, input);
  expect(file.bytes).toBe(bytes);
  const run = await createAndWaitQueued(server.url, file.id);
  return { server, run, bytes, peak: peakRssMiB(server.proc.pid!) * MB };
}
