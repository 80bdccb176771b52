import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectProblem, request } from './support/http.js';
import { startTestServer } from './support/server.js';

// A gzip upload is refused at its first bytes with a 4xx naming the file, not stored and failed
// later as "not valid UTF-8".

let srv: Awaited<ReturnType<typeof startTestServer>>;
beforeAll(async () => {
  srv = await startTestServer({ REGEN_RUNNER: 'false' });
});
afterAll(() => srv?.cleanup());

const jsonl = Array.from({ length: 2000 }, (_, i) => JSON.stringify({ custom_id: `c${i}`, prompt: `prompt ${i}` })).join('\n') + '\n';

describe('compressed uploads', () => {
  it('refuses a gzip raw body, with or without Content-Encoding, and stores nothing', async () => {
    const variants: Record<string, string>[] = [
      { 'content-type': 'application/jsonl' },
      { 'content-type': 'application/octet-stream', 'content-encoding': 'gzip' },
    ];
    for (const headers of variants) {
      const res = await request(srv.url, '/v1/files?filename=p.jsonl.gz', { method: 'POST', headers, body: gzipSync(jsonl) });
      expectProblem(res, 400, { field: 'file', hidden: [srv.config.dataDir] });
      expect(res.text).toMatch(/gzip/);
    }
    const list = await request(srv.url, '/v1/files');
    expect(list.body.data).toEqual([]);
  });

  it('refuses a gzip multipart part', async () => {
    const form = new FormData();
    form.append('purpose', 'batch');
    form.append('file', new Blob([gzipSync(jsonl)]), 'p.jsonl.gz');
    const res = await request(srv.url, '/v1/files', { method: 'POST', body: form });
    expectProblem(res, 400, { field: 'file' });
    expect(res.text).toMatch(/gzip/);
  });

  it('still takes the same file uncompressed', async () => {
    const res = await request(srv.url, '/v1/files?filename=p.jsonl', { method: 'POST', headers: { 'content-type': 'application/jsonl' }, body: jsonl });
    expect(res.status, res.text).toBe(201);
    expect(res.body.bytes).toBe(Buffer.byteLength(jsonl));
  });
});
