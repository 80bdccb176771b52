import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { openaiErrorResponses } from '../../errors.js';
import { getBatchRun, listBatchRuns } from '../../db/batches.js';
import { checkCursor, idCursor, idPlaceable, jsonContent, pageQuery } from '../common.js';
import { renderBatches } from './render.js';
import { BatchList } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/batches',
  operationId: 'listBatches',
  tags: ['batches'],
  summary: 'List batches, newest first',
  request: {
    // OpenAI's page size: 20 by default, at most 100.
    query: pageQuery(idCursor('batch'), { default: 20, max: 100 }),
  },
  responses: { 200: jsonContent(BatchList, 'A page of batches'), ...openaiErrorResponses(400, 401) },
});

export function registerListBatches(app: App) {
  app.openapi(route, async (c) => {
    const { db } = c.get('deps');
    const q = c.req.valid('query');
    await checkCursor(
      q.after,
      'batch',
      idPlaceable('batch', (id) => getBatchRun(db, id)),
    );
    const rows = await listBatchRuns(db, q);
    const data = await renderBatches(db, rows.slice(0, q.limit));
    return c.json({ object: 'list' as const, data, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null, has_more: rows.length > q.limit }, 200);
  });
}
