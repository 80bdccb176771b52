import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { listEndpoints } from '../../db/endpoints.js';
import { jsonContent, listOf, page, idCursor, pageQuery } from '../common.js';
import { endpointCacheUsage } from '../../db/cache-usage.js';
import { Endpoint, renderEndpoint } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/endpoints',
  operationId: 'listEndpoints',
  tags: ['endpoints'],
  summary: 'List registered endpoints with their state, load and stats',
  request: { query: pageQuery(idCursor('ep')) },
  responses: { 200: jsonContent(listOf(Endpoint, 'EndpointList'), 'A page of endpoints'), ...problemResponses(401, 422) },
});

export function registerListEndpoints(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const q = c.req.valid('query');
    const rows = await listEndpoints(deps.db, q);
    const usage = await endpointCacheUsage(deps.db);
    return c.json(
      page(
        rows,
        q.limit,
        (e) => e.id,
        (e) => renderEndpoint(e, deps.runner.endpointLive(e.id), deps.config.defaultConcurrency, usage, deps.clock()),
      ),
      200,
    );
  });
}
