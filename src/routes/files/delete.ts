import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { openaiErrorResponses } from '../../errors.js';
import { removeFile } from '../../services/files.js';
import { FileIdParam, jsonContent } from '../common.js';

const Deleted = z.object({ id: z.string(), object: z.literal('file'), deleted: z.literal(true) }).openapi('FileDeleted');

const route = createRoute({
  method: 'delete',
  path: '/v1/files/{id}',
  operationId: 'deleteFile',
  tags: ['files'],
  summary: 'Delete a file that no unfinished run still reads',
  request: { params: FileIdParam },
  responses: { 200: jsonContent(Deleted, 'The file is gone'), ...openaiErrorResponses(400, 401, 404, 409) },
});

export function registerDeleteFile(app: App) {
  app.openapi(route, async (c) => {
    const { id } = c.req.valid('param');
    await removeFile(c.get('deps'), id);
    return c.json({ id, object: 'file' as const, deleted: true as const }, 200);
  });
}
