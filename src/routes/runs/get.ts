import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, problemResponses } from '../../errors.js';
import { listRunVariants } from '../../db/run-variants.js';
import { jsonContent, RunIdParam } from '../common.js';
import { getRunWithCacheUsage } from '../../db/cache-usage.js';
import { renderCacheByEndpoint, renderRun } from './render.js';
import { Run } from './schemas.js';
import { listRunShards } from '../../db/shards.js';
import { shardsSpread } from '../../domain/token-rows.js';

const route = createRoute({
  method: 'get',
  path: '/v1/runs/{id}',
  operationId: 'getRun',
  tags: ['runs'],
  summary: 'Get a run with its counts, quality, usage and progress',
  request: { params: RunIdParam },
  responses: { 200: jsonContent(Run, 'The run'), ...problemResponses(401, 404, 422) },
});

export function registerGetRun(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { id } = c.req.valid('param');
    const found = await getRunWithCacheUsage(deps.db, id);
    if (!found) throw notFound('run', id);
    const { run } = found;
    const variants = run.variants?.length ? await listRunVariants(deps.db, id) : [];
    const cacheByEndpoint = renderCacheByEndpoint(found.cacheUsage);
    const trainable = run.outputTokens ? shardsSpread(await listRunShards(deps.db, id)) : null;
    return c.json(
      { ...renderRun(run, deps.runner.runProgress(id), deps.clock(), variants), num_trainable: trainable, cache_by_endpoint: cacheByEndpoint },
      200,
    );
  });
}
