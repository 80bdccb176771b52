import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { openaiErrorResponses } from '../../errors.js';
import { listBatchRuns } from '../../db/batches.js';
import { jsonContent } from '../common.js';
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
    query: z.object({
      limit: z.coerce.number().int().min(1).max(100).default(20).openapi({ example: 20 }),
      after: z.string().max(256).optional().openapi({ description: 'The last_id of the previous page' }),
    }),
  },
  responses: { 200: jsonContent(BatchList, 'A page of batches'), ...openaiErrorResponses(400, 401) },
});

export function registerListBatches(app: App) {
  app.openapi(route, async (c) => {
    const { db } = c.get('deps');
    const q = c.req.valid('query');
    const rows = await listBatchRuns(db, q);
    const data = await renderBatches(db, rows.slice(0, q.limit));
    return c.json({ object: 'list' as const, data, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null, has_more: rows.length > q.limit }, 200);
  });
}
