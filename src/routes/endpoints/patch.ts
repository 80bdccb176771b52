import { createRoute } from '@hono/zod-openapi';
import { eq } from 'drizzle-orm';
import type { App } from '../../http/app.js';
import { notFound, problemResponses } from '../../errors.js';
import { getEndpoint } from '../../db/endpoints.js';
import { endpoints } from '../../db/schema.js';
import { EndpointIdParam, jsonContent } from '../common.js';
import { Endpoint, PatchEndpointBody, renderEndpoint } from './schemas.js';

const route = createRoute({
  method: 'patch',
  path: '/v1/endpoints/{id}',
  tags: ['endpoints'],
  summary: 'Change an endpoint: name, max_concurrency, weight, api_key, labels, or state (`draining`, `disabled`, `ready`)',
  description: '`ready` asks for a fresh health probe; the endpoint takes work once the probe passes.',
  request: { params: EndpointIdParam, body: { content: { 'application/json': { schema: PatchEndpointBody } }, required: true } },
  responses: { 200: jsonContent(Endpoint, 'The endpoint after the change'), ...problemResponses(400, 401, 404, 422) },
});

export function registerPatchEndpoint(app: App) {
  app.openapi(route, (c) => {
    const deps = c.get('deps');
    const { id } = c.req.valid('param');
    const body = c.req.valid('json');
    const row = getEndpoint(deps.db, id);
    if (!row) throw notFound('endpoint', id);
    const set = {
      ...(body.name !== undefined && { name: body.name }),
      ...(body.max_concurrency !== undefined && { maxConcurrency: body.max_concurrency }),
      ...(body.weight !== undefined && { weight: body.weight }),
      ...(body.api_key !== undefined && { apiKey: body.api_key }),
      ...(body.labels !== undefined && { labels: body.labels }),
      // Re-enabling goes through a probe rather than trusting the operator's word.
      ...(body.state !== undefined && { state: body.state === 'ready' ? 'starting' : body.state }),
      updatedAt: deps.clock(),
    };
    deps.db.update(endpoints).set(set).where(eq(endpoints.id, id)).run();
    if (body.state && set.state !== row.state) deps.logger.info({ endpoint_id: id, from: row.state, state: set.state }, 'endpoint state');
    deps.runner.wake();
    return c.json(renderEndpoint(getEndpoint(deps.db, id)!, deps.runner.endpointLive(id), deps.config.defaultConcurrency), 200);
  });
}
