import { createRoute } from '@hono/zod-openapi';
import { eq } from 'drizzle-orm';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { newId } from '../../ids.js';
import { endpoints } from '../../db/schema.js';
import { jsonContent } from '../common.js';
import { CreateEndpointBody, Endpoint, normalizeEndpointUrl, renderEndpoint } from './schemas.js';

const route = createRoute({
  method: 'post',
  path: '/v1/endpoints',
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
  app.openapi(route, (c) => {
    const deps = c.get('deps');
    const body = c.req.valid('json');
    const url = normalizeEndpointUrl(body.url);
    const now = deps.clock();
    const existing = deps.db.select().from(endpoints).where(eq(endpoints.url, url)).get();
    const given = {
      ...(body.name !== undefined && { name: body.name }),
      ...(body.api_key !== undefined && { apiKey: body.api_key }),
      ...(body.max_concurrency !== undefined && { maxConcurrency: body.max_concurrency }),
      ...(body.weight !== undefined && { weight: body.weight }),
      ...(body.labels !== undefined && { labels: body.labels }),
    };
    let id: string;
    if (existing) {
      id = existing.id;
      // A re-registration usually means the server restarted: probe it again unless an operator parked it.
      const state = existing.state === 'draining' || existing.state === 'disabled' ? existing.state : 'starting';
      deps.db.update(endpoints).set({ ...given, state, updatedAt: now }).where(eq(endpoints.id, id)).run();
      if (state !== existing.state) deps.logger.info({ endpoint_id: id, url, from: existing.state, state }, 'endpoint state');
    } else {
      id = newId('ep');
      deps.db
        .insert(endpoints)
        .values({ id, url, name: body.name ?? new URL(url).host, state: 'starting', createdAt: now, updatedAt: now, ...given })
        .run();
      deps.logger.info({ endpoint_id: id, url, state: 'starting' }, 'endpoint registered');
    }
    deps.runner.wake();
    const row = deps.db.select().from(endpoints).where(eq(endpoints.id, id)).get()!;
    return c.json(renderEndpoint(row, deps.runner.endpointLive(id), deps.config.defaultConcurrency), existing ? 200 : 201);
  });
}
