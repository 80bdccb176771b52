import { createRoute, z } from '@hono/zod-openapi';
import busboy from 'busboy';
import { eq } from 'drizzle-orm';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import type { App } from '../../http/app.js';
import { validationError } from '../../http/problems.js';
import type { Deps } from '../../deps.js';
import { ApiError, problemResponses } from '../../errors.js';
import { newId } from '../../ids.js';
import { files } from '../../db/schema.js';
import { jsonContent } from '../common.js';
import { FileObject, PURPOSES, renderFile } from './schemas.js';

const RAW_TYPES = ['application/jsonl', 'application/x-ndjson', 'application/octet-stream', 'application/json-lines', 'text/plain'];

const route = createRoute({
  method: 'post',
  path: '/v1/files',
  tags: ['files'],
  summary: 'Upload a JSONL file (raw body or multipart `file` + `purpose`), streamed to object storage',
  request: {
    query: z.object({
      filename: z.string().min(1).max(255).optional(),
      purpose: z.enum(PURPOSES).optional(),
    }),
    body: {
      required: true,
      content: {
        'application/jsonl': { schema: z.string().openapi({ format: 'binary' }) },
        'application/x-ndjson': { schema: z.string().openapi({ format: 'binary' }) },
        'application/octet-stream': { schema: z.string().openapi({ format: 'binary' }) },
        'multipart/form-data': {
          schema: z.object({ file: z.string().openapi({ format: 'binary' }), purpose: z.enum(PURPOSES) }),
        },
      },
    },
  },
  responses: { 201: jsonContent(FileObject, 'The stored file'), ...problemResponses(400, 401, 415, 422, 503) },
});

const eqId = (id: string) => eq(files.id, id);
const cleanName = (name: string) => name.replace(/[\\/\0-\x1f]/g, '_').slice(0, 255) || 'upload.jsonl';

async function store(deps: Deps, filename: string, purpose: string, body: Readable) {
  const id = newId('file');
  const key = `files/${id}.jsonl`;
  let bytes: number;
  try {
    ({ bytes } = await deps.stores.forUri(deps.config.outputUri).putStream(key, body));
  } catch (err) {
    if (err instanceof ApiError) throw err;
    deps.logger.error({ err: { message: (err as Error).message } }, 'file upload to object storage failed');
    throw new ApiError('storage_unavailable', 'the object store could not take the file; try again');
  }
  const row = { id, filename: cleanName(filename), purpose, bytes, objectKey: key, createdAt: deps.clock() };
  deps.db.insert(files).values(row).run();
  return row;
}

/** Drops a stored upload that the request turned out not to want. */
async function discard(deps: Deps, row: { id: string; objectKey: string }) {
  await deps.stores
    .forUri(deps.config.outputUri)
    .delete(row.objectKey)
    .catch(() => {});
  deps.db.delete(files).where(eqId(row.id)).run();
}

const emptyFile = () => new ApiError('invalid_request', 'the file is empty', { field: 'file' });

/** Streams the `file` part of a multipart body into the store; the other fields may come before or after it. */
function multipart(deps: Deps, req: Request, contentType: string) {
  return new Promise<ReturnType<typeof renderFile>>((resolve, reject) => {
    let bb: busboy.Busboy;
    try {
      bb = busboy({ headers: { 'content-type': contentType }, limits: { files: 1, fields: 10, fieldSize: 1024 } });
    } catch {
      return reject(new ApiError('invalid_request', 'malformed multipart/form-data body', { field: 'file' }));
    }
    const fields: Record<string, string> = {};
    let stored: ReturnType<typeof store> | undefined;
    let failed = false;
    bb.on('field', (name, value) => (fields[name] = value));
    bb.on('file', (name, stream, info) => {
      if (name !== 'file' || stored) {
        // A truncated body errors the part being read; unheard, that error would be uncaught.
        stream.on('error', () => {});
        stream.resume();
        return;
      }
      stored = store(deps, info.filename ?? 'upload.jsonl', 'pending', stream);
      stored.catch(() => {});
    });
    // busboy emits `close` after `error` too; the upload is then dropped, not kept half-described.
    bb.on('error', () => {
      failed = true;
      reject(new ApiError('invalid_request', 'malformed multipart/form-data body', { field: 'file' }));
      stored?.then((row) => discard(deps, row), () => {});
    });
    bb.on('close', async () => {
      if (failed) return;
      if (!stored) return reject(new ApiError('validation_failed', 'file: a multipart part named "file" is required', { field: 'file' }));
      try {
        const row = await stored;
        const purpose = fields.purpose ?? 'batch';
        if (row.bytes === 0) {
          await discard(deps, row);
          return reject(emptyFile());
        }
        if (!(PURPOSES as readonly string[]).includes(purpose)) {
          await discard(deps, row);
          return reject(new ApiError('validation_failed', `purpose: expected one of ${PURPOSES.join(', ')}`, { field: 'purpose' }));
        }
        deps.db.update(files).set({ purpose }).where(eqId(row.id)).run();
        resolve(renderFile({ ...row, purpose }));
      } catch (err) {
        reject(err);
      }
    });
    // pipeline, not pipe: a client that hangs up mid-upload fails the form instead of leaving it waiting.
    pipeline(Readable.fromWeb(req.body as WebReadableStream), bb).catch(() => {});
  });
}

// Documented through the registry but handled by hand: the generated validator would read a
// multipart body into memory, and uploads must stream.
export function registerUploadFile(app: App) {
  app.openAPIRegistry.registerPath(route);
  app.post('/v1/files', async (c) => {
    const deps = c.get('deps');
    const contentType = c.req.header('content-type') ?? '';
    const mediaType = contentType.split(';')[0].trim().toLowerCase();
    if (!c.req.raw.body) throw new ApiError('invalid_request', 'the request has no body');
    if (mediaType === 'multipart/form-data') return c.json(await multipart(deps, c.req.raw, contentType), 201);
    if (!RAW_TYPES.includes(mediaType)) {
      throw new ApiError('unsupported_media_type', `send the file as application/jsonl, application/x-ndjson, application/octet-stream or multipart/form-data`);
    }
    const q = route.request.query.safeParse(c.req.query());
    if (!q.success) throw validationError(q.error, 'query');
    const body = Readable.fromWeb(c.req.raw.body as WebReadableStream);
    const row = await store(deps, q.data.filename ?? 'upload.jsonl', q.data.purpose ?? 'regen', body);
    if (row.bytes === 0) {
      await discard(deps, row);
      throw emptyFile();
    }
    return c.json(renderFile(row), 201);
  });
}
