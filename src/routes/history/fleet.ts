import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { jsonContent } from '../common.js';
import { FleetHistoryPoint, renderFleetPoint, StepSeconds } from './schemas.js';
import { HistoryQuery, readWindow } from './window.js';

const FleetHistory = z
  .object({ object: z.literal('list'), step_seconds: StepSeconds, data: z.array(FleetHistoryPoint) })
  .openapi('FleetHistory', { description: 'Oldest first, thinning as it ages; kept across restarts' });

const route = createRoute({
  method: 'get',
  path: '/v1/history',
  operationId: 'getFleetHistory',
  tags: ['service'],
  summary: "The fleet's throughput, requests in flight, caps and prefix-cache hit rate over time",
  request: { query: HistoryQuery },
  responses: { 200: jsonContent(FleetHistory, 'The fleet history'), ...problemResponses(401, 422) },
});

export function registerFleetHistory(app: App) {
  app.openapi(route, async (c) => {
    const { points, stepSeconds } = await readWindow(c.get('deps').db, null, c.req.valid('query'));
    return c.json({ object: 'list' as const, step_seconds: stepSeconds, data: points.map(renderFleetPoint) }, 200);
  });
}
