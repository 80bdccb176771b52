import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { patchEndpoint } from '../../services/endpoints.js';
import { endpointCacheUsage } from '../../db/cache-usage.js';
import { EndpointIdParam, jsonContent } from '../common.js';
import { Endpoint, PatchEndpointBody, renderEndpoint } from './schemas.js';

const route = createRoute({
  method: 'patch',
  path: '/v1/endpoints/{id}',
  operationId: 'updateEndpoint',
  tags: ['endpoints'],
  summary: 'Change an endpoint: name, max_concurrency, weight, api_key, labels, or state (`draining`, `disabled`, `ready`)',
  description: '`ready` asks for a fresh health probe; the endpoint takes work once the probe passes.',
  request: { params: EndpointIdParam, body: { content: { 'application/json': { schema: PatchEndpointBody } }, required: true } },
  responses: { 200: jsonContent(Endpoint, 'The endpoint after the change'), ...problemResponses(400, 401, 404, 413, 422) },
});

export function registerPatchEndpoint(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { id } = c.req.valid('param');
    const row = await patchEndpoint(deps, id, c.req.valid('json'));
    return c.json(renderEndpoint(row, deps.runner.endpointLive(id), deps.config.defaultConcurrency, await endpointCacheUsage(deps.db), deps.clock()), 200);
  });
}
