import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { removeEndpoint } from '../../services/endpoints.js';
import { EndpointIdParam, jsonContent } from '../common.js';

const Deleted = z.object({ id: z.string(), object: z.literal('endpoint'), deleted: z.literal(true) }).openapi('EndpointDeleted');

const route = createRoute({
  method: 'delete',
  path: '/v1/endpoints/{id}',
  operationId: 'deleteEndpoint',
  tags: ['endpoints'],
  summary: 'Remove an endpoint; its in-flight requests are aborted and their samples return to the queue',
  request: { params: EndpointIdParam },
  responses: { 200: jsonContent(Deleted, 'The endpoint is gone'), ...problemResponses(401, 404, 422) },
});

export function registerDeleteEndpoint(app: App) {
  app.openapi(route, async (c) => {
    const { id } = c.req.valid('param');
    await removeEndpoint(c.get('deps'), id);
    return c.json({ id, object: 'endpoint' as const, deleted: true as const }, 200);
  });
}
