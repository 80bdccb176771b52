import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, problemResponses } from '../../errors.js';
import { getRun } from '../../db/runs.js';
import { jsonContent, RunIdParam } from '../common.js';
import { renderRunPoint, RunHistoryPoint, StepSeconds } from './schemas.js';
import { HistoryQuery, readWindow } from './window.js';

const RunHistory = z
  .object({ object: z.literal('list'), run_id: z.string(), step_seconds: StepSeconds, data: z.array(RunHistoryPoint) })
  .openapi('RunHistory', { description: 'Oldest first, from the run’s start to its end, thinning as it ages' });

const route = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/history',
  operationId: 'getRunHistory',
  tags: ['runs'],
  summary: "A run's throughput and prefix-cache hit rate over its whole life",
  request: { params: RunIdParam, query: HistoryQuery },
  responses: { 200: jsonContent(RunHistory, 'The run history'), ...problemResponses(401, 404, 422) },
});

export function registerRunHistory(app: App) {
  app.openapi(route, async (c) => {
    const { db } = c.get('deps');
    const { id } = c.req.valid('param');
    if (!(await getRun(db, id))) throw notFound('run', id);
    const { points, stepSeconds } = await readWindow(db, id, c.req.valid('query'));
    return c.json({ object: 'list' as const, run_id: id, step_seconds: stepSeconds, data: points.map(renderRunPoint) }, 200);
  });
}
