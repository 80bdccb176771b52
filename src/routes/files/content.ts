import { createRoute, z } from '@hono/zod-openapi';
import { Readable } from 'node:stream';
import type { App } from '../../http/app.js';
import { openaiErrorResponses } from '../../errors.js';
import { fileContent } from '../../services/files.js';
import { FileIdParam } from '../common.js';

const route = createRoute({
  method: 'get',
  path: '/v1/files/{id}/content',
  operationId: 'getFileContent',
  tags: ['files'],
  summary: "A file's bytes, streamed",
  request: { params: FileIdParam },
  responses: {
    200: { description: 'The file content', content: { 'application/jsonl': { schema: z.string().openapi({ format: 'binary' }) } } },
    ...openaiErrorResponses(400, 401, 404, 503),
  },
});

export function registerFileContent(app: App) {
  app.openapi(route, async (c) => {
    const { stream, bytes } = await fileContent(c.get('deps'), c.req.valid('param').id);
    return c.body(Readable.toWeb(stream) as ReadableStream, 200, {
      'content-type': 'application/jsonl',
      ...(bytes !== null && { 'content-length': String(bytes) }),
    }) as never;
  });
}
