import { createRoute, z } from '@hono/zod-openapi';
import busboy from 'busboy';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import type { App } from '../../http/app.js';
import { fieldError, validationError } from '../../http/problems.js';
import { textProblem } from '../../domain/text.js';
import type { Deps } from '../../deps.js';
import type { FileRow } from '../../db/schema.js';
import { FILE_PURPOSES, fileObject } from '../../domain/files.js';
import { ApiError, openaiErrorResponses } from '../../errors.js';
import { discardFile, keepFile, storeFile } from '../../services/files.js';
import { jsonContent } from '../common.js';
import { FileObject } from './schemas.js';

const RAW_TYPES = ['application/jsonl', 'application/x-ndjson', 'application/octet-stream', 'application/json-lines', 'text/plain'];

const route = createRoute({
  method: 'post',
  path: '/v1/files',
  operationId: 'uploadFile',
  tags: ['files'],
  summary: 'Upload a JSONL file (raw body or multipart `file` + `purpose`), streamed to object storage',
  request: {
    query: z.object({
      filename: z.string().min(1).max(255).optional(),
      purpose: z.enum(FILE_PURPOSES).optional(),
      'expires_after[anchor]': z.string().max(32).optional().openapi({ description: "With `expires_after[seconds]`: `created_at`, OpenAI's only anchor" }),
      'expires_after[seconds]': z
        .string()
        .max(16)
        .optional()
        .openapi({ description: 'Seconds after the upload when its content is deleted: 3600 to 2592000 (30 days); the object stays, `expired: true`' }),
    }),
    body: {
      required: true,
      content: {
        'application/jsonl': { schema: z.string().openapi({ format: 'binary' }) },
        'application/x-ndjson': { schema: z.string().openapi({ format: 'binary' }) },
        'application/octet-stream': { schema: z.string().openapi({ format: 'binary' }) },
        'multipart/form-data': {
          schema: z.object({
            file: z.string().openapi({ format: 'binary' }),
            purpose: z.enum(FILE_PURPOSES),
            'expires_after[anchor]': z.string().optional(),
            'expires_after[seconds]': z.string().optional(),
          }),
        },
      },
    },
  },
  responses: { 201: jsonContent(FileObject, 'The stored file'), ...openaiErrorResponses(400, 401, 415, 503) },
});

/** Streams the `file` part of a multipart body into the store; the other fields may come before or after it. */
function multipart(deps: Deps, req: Request, contentType: string) {
  return new Promise<ReturnType<typeof fileObject>>((resolve, reject) => {
    let bb: busboy.Busboy;
    try {
      bb = busboy({ headers: { 'content-type': contentType }, limits: { files: 1, fields: 10, fieldSize: 1024 } });
    } catch {
      return reject(new ApiError('invalid_request', 'malformed multipart/form-data body', { field: 'file' }));
    }
    const fields: Record<string, string> = {};
    let stored: Promise<FileRow> | undefined;
    let failed = false;
    let refused: ApiError | undefined;
    bb.on('field', (name, value) => (fields[name] = value));
    bb.on('file', (name, stream, info) => {
      const badName = textProblem(info.filename ?? '');
      if (badName && name === 'file') refused = fieldError('filename', badName);
      if (name !== 'file' || stored || refused) {
        // A truncated body errors the part being read; unheard, that error would be uncaught.
        stream.on('error', () => {});
        stream.resume();
        return;
      }
      stored = storeFile(deps, info.filename ?? 'upload.jsonl', 'pending', stream);
      stored.catch(() => {});
    });
    // busboy emits `close` after `error` too; the upload is then dropped, not kept half-described.
    // The answer waits for the drop: a file part that ended before the form broke is still being
    // stored, and a client told its upload failed must not find it listed afterwards, nor a
    // shutdown that waits for open requests leave its row behind.
    bb.on('error', async () => {
      failed = true;
      const row = await stored?.catch(() => undefined);
      if (row) {
        await discardFile(deps, row).catch((err: Error) => {
          deps.logger.error({ file_id: row.id, err: { message: err.message } }, 'dropping a broken multipart upload failed');
        });
      }
      reject(new ApiError('invalid_request', 'malformed multipart/form-data body', { field: 'file' }));
    });
    bb.on('close', async () => {
      if (failed) return;
      if (refused) return reject(refused);
      if (!stored) return reject(new ApiError('validation_failed', 'file: a multipart part named "file" is required', { field: 'file' }));
      try {
        const expiry = { anchor: fields['expires_after[anchor]'], seconds: fields['expires_after[seconds]'] };
        resolve(fileObject(await keepFile(deps, await stored, fields.purpose ?? 'batch', expiry)));
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
    const row = await storeFile(deps, q.data.filename ?? 'upload.jsonl', q.data.purpose ?? 'regen', body);
    const expiry = { anchor: q.data['expires_after[anchor]'], seconds: q.data['expires_after[seconds]'] };
    return c.json(fileObject(await keepFile(deps, row, undefined, expiry)), 201);
  });
}
