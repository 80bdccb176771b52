import { expectProblem as shared, request, type Raw } from './support/http.js';
import { createReadStream, existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, tempDir, waitFor } from './support/server.js';
import { TEMP_FOLDER } from '../src/storage/location.js';

let server: Awaited<ReturnType<typeof startTestServer>>;
const tmp = tempDir('regen-files-test-');

beforeAll(async () => {
  server = await startTestServer({ REGEN_RUNNER: 'false' });
});
afterAll(async () => {
  await server?.cleanup();
  tmp.cleanup();
});

const req = (path: string, init: RequestInit & { duplex?: 'half' } = {}) => request(server.url, path, init);

/**
 * Every error is problem+json with a code and a detail, and leaks no stack, path or exception
 * text; on these OpenAI routes it carries OpenAI's envelope too, with the same message and field.
 */
function expectProblem(res: Raw, status: number, code?: string) {
  shared(res, status, { code, hidden: [server.config.dataDir] });
  expect(res.body.error).toEqual({
    message: res.body.detail,
    type: status >= 500 ? 'server_error' : 'invalid_request_error',
    param: res.body.field ?? null,
    code: res.body.code,
  });
}

async function fileCount(): Promise<number> {
  return (await req('/v1/files?limit=1000')).body.data.length;
}

/** Uploads are written under the store's temp folder and moved into objects/files/ once whole. */
function tempUploads(): string[] {
  const dir = join(server.config.dataDir, 'objects', TEMP_FOLDER);
  return existsSync(dir) ? readdirSync(dir).filter((f) => f.startsWith('file_')) : [];
}

function storedObjects(): string[] {
  const dir = join(server.config.dataDir, 'objects', 'files');
  return existsSync(dir) ? readdirSync(dir) : [];
}

const lines = (n: number, tag: string) =>
  Array.from({ length: n }, (_, i) => JSON.stringify({ custom_id: `${tag}-${i}`, messages: [{ role: 'user', content: `hello ${i}` }] })).join('\n') + '\n';

function expectFileObject(f: any, bytes: number, filename: string, purpose: string) {
  expect(f).toMatchObject({ object: 'file', bytes, filename, purpose });
  expect(f.id).toMatch(/^file_/);
  // Unix seconds, as OpenAI's File object has it.
  expect(Number.isInteger(f.created_at) && Math.abs(f.created_at - Date.now() / 1000) < 3600).toBe(true);
}

describe('POST /v1/files with a raw body', () => {
  for (const type of ['application/jsonl', 'application/x-ndjson', 'application/octet-stream']) {
    it(`stores a ${type} body byte for byte`, async () => {
      const text = lines(5, type.replace(/\W/g, ''));
      const up = await req(`/v1/files?filename=in-${type.split('/')[1]}.jsonl`, { method: 'POST', headers: { 'content-type': type }, body: text });
      expect(up.status, up.text).toBe(201);
      expectFileObject(up.body, Buffer.byteLength(text), `in-${type.split('/')[1]}.jsonl`, up.body.purpose);

      const got = await req(`/v1/files/${up.body.id}`);
      expect(got.status).toBe(200);
      expect(got.body).toEqual(up.body);

      const content = await fetch(`${server.url}/v1/files/${up.body.id}/content`);
      expect(content.status).toBe(200);
      expect(Buffer.from(await content.arrayBuffer()).equals(Buffer.from(text))).toBe(true);
    });
  }

  it('names the file upload.jsonl when no ?filename= is given, and keeps a content-type parameter out of the way', async () => {
    const up = await req('/v1/files', { method: 'POST', headers: { 'content-type': 'application/jsonl; charset=utf-8' }, body: lines(1, 'n') });
    expect(up.status, up.text).toBe(201);
    expect(up.body.filename).toBe('upload.jsonl');
  });

  it('strips path separators from ?filename=', async () => {
    const up = await req(`/v1/files?filename=${encodeURIComponent('../../etc/passwd')}`, {
      method: 'POST',
      headers: { 'content-type': 'application/jsonl' },
      body: lines(1, 'p'),
    });
    expect(up.status, up.text).toBe(201);
    expect(up.body.filename).not.toContain('/');
  });

  it('keeps non-UTF-8 and binary bytes intact', async () => {
    const bytes = Buffer.from([0xff, 0xfe, 0x00, 0x0a, 0x80, 0x81, 0x0a, 0xe2, 0x82]);
    const up = await req('/v1/files', { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: bytes });
    expect(up.status).toBe(201);
    expect(up.body.bytes).toBe(bytes.length);
    const content = await fetch(`${server.url}/v1/files/${up.body.id}/content`);
    expect(Buffer.from(await content.arrayBuffer()).equals(bytes)).toBe(true);
  });

  it('answers 415 problem+json for other content types', async () => {
    for (const type of ['application/json', 'text/html', 'image/png', 'application/x-www-form-urlencoded']) {
      const res = await req('/v1/files', { method: 'POST', headers: { 'content-type': type }, body: lines(1, 'x') });
      expectProblem(res, 415, 'unsupported_media_type');
    }
  });

  it('rejects a bad ?purpose= with 400 naming the field', async () => {
    const res = await req('/v1/files?purpose=nonsense', { method: 'POST', headers: { 'content-type': 'application/jsonl' }, body: lines(1, 'x') });
    expectProblem(res, 400, 'validation_failed');
    expect(res.body.field).toBe('purpose');
  });

  it('rejects an empty body with 400, keeping nothing', async () => {
    const before = await fileCount();
    const res = await req('/v1/files', { method: 'POST', headers: { 'content-type': 'application/jsonl' } });
    expectProblem(res, 400, 'invalid_request');
    expect(await fileCount()).toBe(before);
  });
});

describe('POST /v1/files with multipart/form-data', () => {
  it('takes what the official openai client sends', async () => {
    const path = join(tmp.dir, 'batch-input.jsonl');
    const text = lines(20, 'sdk');
    writeFileSync(path, text);
    const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const file = await client.files.create({ file: createReadStream(path), purpose: 'batch' });
    expectFileObject(file, Buffer.byteLength(text), 'batch-input.jsonl', 'batch');

    const again = await client.files.retrieve(file.id);
    expect(again.id).toBe(file.id);
    const content = await fetch(`${server.url}/v1/files/${file.id}/content`);
    expect(await content.text()).toBe(text);
  });

  it('takes a hand-built FormData, with purpose before or after the file', async () => {
    const text = lines(3, 'form');
    for (const purposeFirst of [true, false]) {
      const form = new FormData();
      if (purposeFirst) form.append('purpose', 'batch');
      form.append('file', new Blob([text], { type: 'application/jsonl' }), 'form.jsonl');
      if (!purposeFirst) form.append('purpose', 'batch');
      const up = await req('/v1/files', { method: 'POST', body: form });
      expect(up.status, up.text).toBe(201);
      expectFileObject(up.body, Buffer.byteLength(text), 'form.jsonl', 'batch');
      const content = await fetch(`${server.url}/v1/files/${up.body.id}/content`);
      expect(await content.text()).toBe(text);
    }
  });

  it('rejects a form without a file part, or with an unknown purpose, with 400 naming the field', async () => {
    const noFile = new FormData();
    noFile.append('purpose', 'batch');
    const a = await req('/v1/files', { method: 'POST', body: noFile });
    expectProblem(a, 400, 'validation_failed');
    expect(a.body.field).toBe('file');

    const before = await fileCount();
    const badPurpose = new FormData();
    badPurpose.append('file', new Blob(['{}\n']), 'x.jsonl');
    badPurpose.append('purpose', 'weights');
    const b = await req('/v1/files', { method: 'POST', body: badPurpose });
    expectProblem(b, 400, 'validation_failed');
    expect(b.body.field).toBe('purpose');
    // The rejected upload leaves nothing behind.
    expect(await fileCount()).toBe(before);
  });

  it('rejects a multipart body without a boundary as a 400 problem', async () => {
    const res = await req('/v1/files', { method: 'POST', headers: { 'content-type': 'multipart/form-data' }, body: 'garbage' });
    expectProblem(res, 400, 'invalid_request');
  });

  it('rejects a truncated multipart body with a 400 problem and keeps nothing (the server survives)', async () => {
    const boundary = 'XyZ123';
    const head = `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="t.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n{"a":1}\n`;
    const bodies = [
      head, // cut inside the file part
      `${head}\r\n--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch`, // file complete, form cut
      `--${boundary}\r\nContent-Disposition: form-data; name="other"; filename="o.bin"\r\n\r\nxx`, // cut inside another part
    ];
    const before = await fileCount();
    const objects = storedObjects();
    for (const body of bodies) {
      const res = await req('/v1/files', { method: 'POST', headers: { 'content-type': `multipart/form-data; boundary=${boundary}` }, body });
      expectProblem(res, 400, 'invalid_request');
      // The answer comes once the upload is dropped: a file part that ended before the form broke
      // was being stored, and is gone by the time the client hears of the failure.
      expect(await fileCount()).toBe(before);
      expect(storedObjects()).toEqual(objects);
      expect(tempUploads()).toEqual([]);
    }
    expect((await req('/healthz')).status).toBe(200);
  });

  it('rejects an empty file part with 400', async () => {
    const form = new FormData();
    form.append('purpose', 'batch');
    form.append('file', new Blob([]), 'empty.jsonl');
    expectProblem(await req('/v1/files', { method: 'POST', body: form }), 400, 'invalid_request');
  });
});

describe('a client that hangs up mid-upload', () => {
  for (const kind of ['raw', 'multipart'] as const) {
    it(`leaves no file, row or temp object behind (${kind})`, async () => {
      const before = await fileCount();
      const boundary = 'HangUp42';
      const head =
        kind === 'raw' ? '' : `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="h.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n`;
      const url = new URL(`${server.url}/v1/files`);
      const upload = httpRequest({
        host: url.hostname,
        port: url.port,
        path: url.pathname,
        method: 'POST',
        headers: {
          'content-type': kind === 'raw' ? 'application/jsonl' : `multipart/form-data; boundary=${boundary}`,
          'content-length': String(10 << 20),
        },
      });
      upload.on('error', () => {});
      upload.write(head + lines(2000, 'hang'));
      // A temp upload is named after its file id, so the cut upload's row and object can be asked for.
      const [temp] = await waitFor(
        'the upload under way',
        () => {
          const found = tempUploads();
          return found.length > 0 ? found : undefined;
        },
        30_000,
        10,
      );
      const id = temp.split('.')[0];
      upload.destroy();
      // Nobody is left to answer, so the cleanup is watched for; the state is in the error if it never comes.
      await waitFor(
        'the cut upload cleaned up',
        async () => {
          const state = {
            temps: tempUploads(),
            files: await fileCount(),
            before,
            row: (await req(`/v1/files/${id}`)).status,
            object: storedObjects().includes(`${id}.jsonl`),
          };
          if (state.temps.length === 0 && state.files === before && state.row === 404 && !state.object) return true;
          throw new Error(JSON.stringify(state));
        },
        30_000,
      );
      expect((await req('/healthz')).status).toBe(200);
    });
  }
});

describe('GET and DELETE /v1/files/{id}', () => {
  it('deletes a file; afterwards its metadata and content are 404', async () => {
    const up = await req('/v1/files', { method: 'POST', headers: { 'content-type': 'application/jsonl' }, body: lines(2, 'del') });
    const del = await req(`/v1/files/${up.body.id}`, { method: 'DELETE' });
    expect(del.status).toBe(200);
    expect(del.body).toEqual({ id: up.body.id, object: 'file', deleted: true });
    expectProblem(await req(`/v1/files/${up.body.id}`), 404, 'not_found');
    expectProblem(await req(`/v1/files/${up.body.id}/content`), 404, 'not_found');
    expectProblem(await req(`/v1/files/${up.body.id}`, { method: 'DELETE' }), 404, 'not_found');
  });

  it('answers 404 for unknown ids and 400 for malformed ones', async () => {
    expectProblem(await req('/v1/files/file_doesnotexist'), 404, 'not_found');
    expectProblem(await req('/v1/files/file_doesnotexist/content'), 404, 'not_found');
    const bad = await req(`/v1/files/${encodeURIComponent('file_a b')}`);
    expectProblem(bad, 400, 'validation_failed');
    expect(bad.body.field).toBe('id');
  });

  it('answers 503 problem (no path) when the stored object went missing', async () => {
    const up = await req('/v1/files', { method: 'POST', headers: { 'content-type': 'application/jsonl' }, body: lines(1, 'gone') });
    const { rmSync } = await import('node:fs');
    rmSync(join(server.config.dataDir, 'objects', 'files', `${up.body.id}.jsonl`));
    expectProblem(await req(`/v1/files/${up.body.id}/content`), 503, 'storage_unavailable');
  });
});

describe('GET /v1/files', () => {
  it('pages newest first with limit, after, has_more, first_id and last_id', async () => {
    const made: string[] = [];
    for (let i = 0; i < 7; i++) {
      const up = await req(`/v1/files?filename=page-${i}.jsonl&purpose=user_data`, {
        method: 'POST',
        headers: { 'content-type': 'application/jsonl' },
        body: lines(1, `pg${i}`),
      });
      expect(up.status).toBe(201);
      made.push(up.body.id);
    }
    const seen: string[] = [];
    let after: string | null = null;
    let pages = 0;
    for (;;) {
      const res: Raw = await req(`/v1/files?purpose=user_data&limit=3${after ? `&after=${after}` : ''}`);
      expect(res.status).toBe(200);
      expect(res.body.object).toBe('list');
      pages++;
      seen.push(...res.body.data.map((f: any) => f.id));
      expect(res.body.first_id).toBe(res.body.data[0]?.id ?? null);
      expect(res.body.last_id).toBe(res.body.data.at(-1)?.id ?? null);
      if (!res.body.has_more) break;
      expect(res.body.data).toHaveLength(3);
      after = res.body.last_id;
    }
    expect(pages).toBe(3);
    expect(seen).toEqual([...made].reverse());

    const all = await req('/v1/files?limit=1000');
    expect(all.body.has_more).toBe(false);
    expect(all.body.data.map((f: any) => f.id)).toEqual(expect.arrayContaining(made));
  });

  it('rejects limit 0, limit 5000 and a bad purpose with 400', async () => {
    for (const q of ['limit=0', 'limit=5000', 'limit=abc', 'purpose=nope']) {
      const res = await req(`/v1/files?${q}`);
      expectProblem(res, 400, 'validation_failed');
      expect(res.body.field).toBe(q.split('=')[0]);
    }
  });

  it('an empty list has first_id and last_id null', async () => {
    const oldest = (await req('/v1/files?limit=1000')).body.data.at(-1).id;
    const res = await req(`/v1/files?after=${oldest}`);
    expect(res.body).toEqual({ object: 'list', data: [], has_more: false, first_id: null, last_id: null });
  });

  it("refuses a cursor it cannot place with a 400 naming after; a deleted file's id goes on from where it stood", async () => {
    for (const after of ['file_0', `file_${'z'.repeat(60)}`, `file_${(Date.now() + 86_400_000).toString(36)}${'0'.repeat(16)}`, 'run_0']) {
      const res = await req(`/v1/files?after=${after}`);
      expectProblem(res, 400, 'validation_failed');
      expect(res.body.field).toBe('after');
    }
    const made: string[] = [];
    for (let i = 0; i < 3; i++) {
      const up = await req(`/v1/files?filename=gone-${i}.jsonl&purpose=user_data`, {
        method: 'POST',
        headers: { 'content-type': 'application/jsonl' },
        body: lines(1, `gone${i}`),
      });
      made.push(up.body.id);
    }
    expect((await req(`/v1/files/${made[1]}`, { method: 'DELETE' })).status).toBe(200);
    const next = await req(`/v1/files?limit=1&after=${made[1]}`);
    expect(next.status, next.text).toBe(200);
    expect(next.body.data.map((f: any) => f.id)).toEqual([made[0]]);
  });
});

describe('file content bytes', () => {
  it('streams a larger file back identical, with its content-length', async () => {
    const text = lines(20_000, 'big');
    const up = await req('/v1/files', { method: 'POST', headers: { 'content-type': 'application/x-ndjson' }, body: text });
    expect(up.body.bytes).toBe(Buffer.byteLength(text));
    const res = await fetch(`${server.url}/v1/files/${up.body.id}/content`);
    expect(res.headers.get('content-length')).toBe(String(Buffer.byteLength(text)));
    const got = Buffer.from(await res.arrayBuffer());
    expect(got.equals(Buffer.from(text))).toBe(true);
    expect(readFileSync(join(server.config.dataDir, 'objects', 'files', `${up.body.id}.jsonl`)).equals(got)).toBe(true);
  });
});

describe('with REGEN_API_TOKENS set', () => {
  it('an upload without the bearer token is a 401 problem and stores nothing', async () => {
    const secured = await startTestServer({ REGEN_RUNNER: 'false', REGEN_API_TOKENS: 'tok-1,tok-2' });
    try {
      const send = (headers: Record<string, string>) =>
        fetch(`${secured.url}/v1/files`, { method: 'POST', headers: { 'content-type': 'application/jsonl', ...headers }, body: lines(3, 'auth') });
      const refused: Record<string, string>[] = [{}, { authorization: 'Bearer nope' }, { authorization: 'tok-1' }];
      for (const headers of refused) {
        const res = await send(headers);
        expect(res.status).toBe(401);
        expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
        const text = await res.text();
        expect(text).not.toContain('tok-');
      }
      const list = await fetch(`${secured.url}/v1/files`, { headers: { authorization: 'Bearer tok-2' } });
      expect((await list.json()).data).toEqual([]);
      const ok = await send({ authorization: 'Bearer tok-1' });
      expect(ok.status).toBe(201);
    } finally {
      await secured.cleanup();
    }
  });
});
