import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { FILE_PURPOSES, fileObject } from '../../domain/files.js';
import { openaiErrorResponses } from '../../errors.js';
import { listFiles } from '../../db/files.js';
import { jsonContent, listOf, page, idCursor, pageQuery } from '../common.js';
import { FileObject } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/files',
  operationId: 'listFiles',
  tags: ['files'],
  summary: 'List files, newest first',
  request: { query: pageQuery(idCursor('file')).extend({ purpose: z.enum(FILE_PURPOSES).optional() }) },
  responses: { 200: jsonContent(listOf(FileObject, 'FileList'), 'A page of files'), ...openaiErrorResponses(400, 401) },
});

export function registerListFiles(app: App) {
  app.openapi(route, async (c) => {
    const q = c.req.valid('query');
    return c.json(
      page(await listFiles(c.get('deps').db, q), q.limit, (f) => f.id, fileObject),
      200,
    );
  });
}
