import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { upsertEndpoint } from '../../services/endpoints.js';
import { jsonContent } from '../common.js';
import { endpointCacheUsage } from '../../db/cache-usage.js';
import { CreateEndpointBody, Endpoint, renderEndpoint } from './schemas.js';

const route = createRoute({
  method: 'post',
  path: '/v1/endpoints',
  operationId: 'registerEndpoint',
  tags: ['endpoints'],
  summary: 'Register an SGLang server (an upsert by url, so a launch script can call it on every boot)',
  request: { body: { content: { 'application/json': { schema: CreateEndpointBody } }, required: true } },
  responses: {
    200: jsonContent(Endpoint, 'The endpoint was already registered; it was updated and will be probed again'),
    201: jsonContent(Endpoint, 'The endpoint was registered; it starts in `starting` until its first healthy probe'),
    ...problemResponses(400, 401, 413, 422),
  },
});

export function registerUpsertEndpoint(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { endpoint, created } = await upsertEndpoint(deps, c.req.valid('json'));
    return c.json(
      renderEndpoint(endpoint, deps.runner.endpointLive(endpoint.id), deps.config.defaultConcurrency, await endpointCacheUsage(deps.db), deps.clock()),
      created ? 201 : 200,
    );
  });
}
