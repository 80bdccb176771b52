import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../app.js';
import { notFound, problemResponses } from '../../errors.js';
import { getFile } from '../../db/files.js';
import { FileIdParam, jsonContent } from '../common.js';
import { FileObject, renderFile } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/files/{id}',
  tags: ['files'],
  summary: "A file's metadata",
  request: { params: FileIdParam },
  responses: { 200: jsonContent(FileObject, 'The file'), ...problemResponses(401, 404, 422) },
});

export function registerGetFile(app: App) {
  app.openapi(route, (c) => {
    const { id } = c.req.valid('param');
    const file = getFile(c.get('deps').db, id);
    if (!file) throw notFound('file', id);
    return c.json(renderFile(file), 200);
  });
}
