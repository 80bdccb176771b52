import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { getRun, listRuns } from '../../db/runs.js';
import { listRunVariants } from '../../db/run-variants.js';
import { checkCursor, idCursor, idPlaceable, jsonContent, listOf, page, pageQuery } from '../common.js';
import { renderRun } from './render.js';
import { Run, RunStatus } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/runs',
  operationId: 'listRuns',
  tags: ['runs'],
  summary: 'List runs, newest first',
  request: {
    query: pageQuery(idCursor('run')).extend({
      status: RunStatus.optional(),
      name: z.string().max(256).optional().openapi({ description: 'Only runs whose name contains this, in any case' }),
    }),
  },
  responses: { 200: jsonContent(listOf(Run, 'RunList'), 'A page of runs'), ...problemResponses(401, 422) },
});

export function registerListRuns(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const q = c.req.valid('query');
    await checkCursor(
      q.after,
      'run',
      idPlaceable('run', (id) => getRun(deps.db, id)),
    );
    const rows = await listRuns(deps.db, q);
    // Only runs with variants have counters of them to read: one indexed read each.
    const variants = new Map(await Promise.all(rows.filter((r) => r.variants?.length).map(async (r) => [r.id, await listRunVariants(deps.db, r.id)] as const)));
    const now = deps.clock();
    return c.json(
      page(
        rows,
        q.limit,
        (r) => r.id,
        (r) => renderRun(r, deps.runner.runProgress(r.id), now, variants.get(r.id)),
      ),
      200,
    );
  });
}
