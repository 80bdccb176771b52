import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { readHistory } from '../../db/history.js';
import { jsonContent } from '../common.js';
import { FleetHistoryPoint, renderFleetPoint } from './schemas.js';

const FleetHistory = z
  .object({ object: z.literal('list'), data: z.array(FleetHistoryPoint) })
  .openapi('FleetHistory', { description: 'Oldest first, thinning as it ages; kept across restarts' });

const route = createRoute({
  method: 'get',
  path: '/v1/history',
  operationId: 'getFleetHistory',
  tags: ['service'],
  summary: "The fleet's throughput, requests in flight, caps and prefix-cache hit rate over time",
  responses: { 200: jsonContent(FleetHistory, 'The fleet history'), ...problemResponses(401) },
});

export function registerFleetHistory(app: App) {
  app.openapi(route, async (c) => {
    const { db } = c.get('deps');
    return c.json({ object: 'list' as const, data: (await readHistory(db, null)).map(renderFleetPoint) }, 200);
  });
}
