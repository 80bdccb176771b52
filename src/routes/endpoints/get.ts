import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, problemResponses } from '../../errors.js';
import { getEndpoint } from '../../db/endpoints.js';
import { endpointCacheUsage } from '../../db/cache-usage.js';
import { EndpointIdParam, jsonContent } from '../common.js';
import { Endpoint, renderEndpoint } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/endpoints/{id}',
  operationId: 'getEndpoint',
  tags: ['endpoints'],
  summary: 'Get an endpoint',
  request: { params: EndpointIdParam },
  responses: { 200: jsonContent(Endpoint, 'The endpoint'), ...problemResponses(401, 404, 422) },
});

export function registerGetEndpoint(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { id } = c.req.valid('param');
    const row = await getEndpoint(deps.db, id);
    if (!row) throw notFound('endpoint', id);
    return c.json(renderEndpoint(row, deps.runner.endpointLive(id), deps.config.defaultConcurrency, await endpointCacheUsage(deps.db), deps.clock()), 200);
  });
}
