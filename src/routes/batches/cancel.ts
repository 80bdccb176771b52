import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, openaiErrorResponses } from '../../errors.js';
import { getBatchRun } from '../../db/batches.js';
import { cancelRun } from '../../services/runs/actions.js';
import { jsonContent } from '../common.js';
import { renderBatches } from './render.js';
import { Batch, BatchIdParam } from './schemas.js';

const route = createRoute({
  method: 'post',
  path: '/v1/batches/{id}/cancel',
  operationId: 'cancelBatch',
  tags: ['batches'],
  summary: 'Cancel a batch: in-flight requests are aborted, answers so far stay in the output file',
  request: { params: BatchIdParam },
  responses: {
    200: jsonContent(Batch, 'The batch, `cancelling` (or `cancelled` while it was still validating)'),
    ...openaiErrorResponses(400, 401, 404, 409, 413),
  },
});

export function registerCancelBatch(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { id } = c.req.valid('param');
    const run = await getBatchRun(deps.db, id);
    if (!run) throw notFound('batch', id);
    const [batch] = await renderBatches(deps.db, [await cancelRun(deps, run.id)]);
    return c.json(batch, 200);
  });
}
