import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, openaiErrorResponses } from '../../errors.js';
import { getBatchRun } from '../../db/batches.js';
import { jsonContent } from '../common.js';
import { renderBatches } from './render.js';
import { Batch, BatchIdParam } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/batches/{id}',
  operationId: 'getBatch',
  tags: ['batches'],
  summary: 'Get a batch: its status, request counts, errors and output files',
  request: { params: BatchIdParam },
  responses: { 200: jsonContent(Batch, 'The batch'), ...openaiErrorResponses(400, 401, 404) },
});

export function registerGetBatch(app: App) {
  app.openapi(route, async (c) => {
    const { db } = c.get('deps');
    const { id } = c.req.valid('param');
    const run = await getBatchRun(db, id);
    if (!run) throw notFound('batch', id);
    const [batch] = await renderBatches(db, [run]);
    return c.json(batch, 200);
  });
}
