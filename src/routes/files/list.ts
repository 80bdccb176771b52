import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { FILE_PURPOSES, fileObject } from '../../domain/files.js';
import { openaiErrorResponses } from '../../errors.js';
import { getFile, listFiles } from '../../db/files.js';
import { checkCursor, idCursor, idPlaceable, jsonContent, listOf, page, pageQuery } from '../common.js';
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
    const { db } = c.get('deps');
    await checkCursor(
      q.after,
      'file',
      idPlaceable('file', (id) => getFile(db, id)),
    );
    return c.json(
      page(await listFiles(db, q), q.limit, (f) => f.id, fileObject),
      200,
    );
  });
}
