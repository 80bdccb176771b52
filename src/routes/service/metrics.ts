import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';

const route = createRoute({
  method: 'get',
  path: '/metrics',
  operationId: 'getMetrics',
  tags: ['service'],
  summary: 'Prometheus metrics',
  description:
    'Samples by run and status, runs by status, in-flight requests, concurrency and state per endpoint, request latency, ' +
    'completion tokens, retries by reason, quality flags, shard uploads and their failures. Needs the bearer token when ' +
    'REGEN_API_TOKENS is set.',
  responses: {
    200: { description: 'Prometheus text exposition format', content: { 'text/plain': { schema: z.string() } } },
    ...problemResponses(401),
  },
});

export function registerMetrics(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const text = await deps.metrics.render({
      db: deps.db,
      runner: deps.runner,
      defaultConcurrency: deps.config.defaultConcurrency,
      now: deps.clock(),
    });
    return c.body(text, 200, { 'content-type': deps.metrics.contentType }) as never;
  });
}
