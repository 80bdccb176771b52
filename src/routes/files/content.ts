import { createRoute, z } from '@hono/zod-openapi';
import { Readable } from 'node:stream';
import type { App } from '../../http/app.js';
import { ApiError, notFound, problemResponses } from '../../errors.js';
import { getFile } from '../../db/files.js';
import { batchFileStream, resolveBatchFile } from '../../runner/batch-files.js';
import { FileIdParam } from '../common.js';

const route = createRoute({
  method: 'get',
  path: '/v1/files/{id}/content',
  tags: ['files'],
  summary: "A file's bytes, streamed",
  request: { params: FileIdParam },
  responses: {
    200: { description: 'The file content', content: { 'application/jsonl': { schema: z.string().openapi({ format: 'binary' }) } } },
    ...problemResponses(401, 404, 422, 503),
  },
});

export function registerFileContent(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { id } = c.req.valid('param');
    const file = getFile(deps.db, id);
    if (!file) {
      // A batch's output and error files are made from its shards as they are sent.
      const batchFile = resolveBatchFile(deps.db, id);
      if (!batchFile) throw notFound('file', id);
      const lines = batchFileStream(deps, batchFile.run, batchFile.kind).on('error', (err) => {
        deps.logger.error({ file_id: id, err: { message: err.message } }, 'batch file read failed');
      });
      return c.body(Readable.toWeb(lines) as ReadableStream, 200, { 'content-type': 'application/jsonl' }) as never;
    }
    let stream: Readable;
    try {
      stream = await deps.stores.forUri(deps.config.outputUri).getStream(file.objectKey);
    } catch (err) {
      deps.logger.error({ file_id: id, err: { message: (err as Error).message } }, 'file content read failed');
      throw new ApiError('storage_unavailable', 'the object store could not return the file; try again');
    }
    return c.body(Readable.toWeb(stream) as ReadableStream, 200, {
      'content-type': 'application/jsonl',
      'content-length': String(file.bytes),
    }) as never;
  });
}
