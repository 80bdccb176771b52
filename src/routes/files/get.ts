import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, openaiErrorResponses } from '../../errors.js';
import { getFile } from '../../db/files.js';
import { renderBatchFile, resolveBatchFile } from '../../services/batches/files.js';
import { FileIdParam, jsonContent } from '../common.js';
import { fileObject } from '../../domain/files.js';
import { FileObject } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/files/{id}',
  operationId: 'getFile',
  tags: ['files'],
  summary: "A file's metadata",
  request: { params: FileIdParam },
  responses: { 200: jsonContent(FileObject, 'The file'), ...openaiErrorResponses(400, 401, 404) },
});

export function registerGetFile(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { id } = c.req.valid('param');
    const file = await getFile(deps.db, id);
    if (file) return c.json(fileObject(file), 200);
    const batchFile = await resolveBatchFile(deps.db, id);
    if (!batchFile) throw notFound('file', id);
    return c.json(await renderBatchFile(deps, batchFile.run, batchFile.kind), 200);
  });
}
