import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, problemResponses } from '../../errors.js';
import { getRun } from '../../db/runs.js';
import { listShards } from '../../db/samples.js';
import { jsonContent, listOf, page, pageQuery, RunIdParam } from '../common.js';
import { renderShard } from './render.js';
import { Shard } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/shards',
  operationId: 'listRunShards',
  tags: ['runs'],
  summary: "List a run's shards with their upload state, sizes and checksums",
  request: {
    params: RunIdParam,
    query: pageQuery(z.string().max(12).regex(/^\d+$/, 'must be the last_id of a previous page (a shard index)')),
  },
  responses: { 200: jsonContent(listOf(Shard, 'ShardList'), 'A page of shards'), ...problemResponses(401, 404, 422) },
});

export function registerListShards(app: App) {
  app.openapi(route, async (c) => {
    const { db } = c.get('deps');
    const { id } = c.req.valid('param');
    if (!(await getRun(db, id))) throw notFound('run', id);
    const q = c.req.valid('query');
    const rows = await listShards(db, id, { after: q.after === undefined ? undefined : Number(q.after), limit: q.limit });
    return c.json(
      page(rows, q.limit, (s) => String(s.idx), renderShard),
      200,
    );
  });
}
