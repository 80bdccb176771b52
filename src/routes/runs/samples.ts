import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, problemResponses } from '../../errors.js';
import { getRun } from '../../db/runs.js';
import { getSample, listSamples } from '../../db/samples.js';
import { checkCursor, jsonContent, listOf, page, pageQuery, RunIdParam } from '../common.js';
import { answeredTurnCounts } from '../../db/sample-turns.js';
import { variantName } from '../../domain/variants.js';
import { renderSample } from './render.js';
import { Flag, Sample, SampleStatus } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/samples',
  operationId: 'listRunSamples',
  tags: ['runs'],
  summary: "List a run's samples in input order, filtered by status or quality flag",
  description:
    'With params.n > 1 a line has n samples (sample_index 0…n−1) under one custom_id: a page never ends inside a line (it takes the rest of its samples, past `limit`), so `after` = the last custom_id goes on from the next line.',
  request: { params: RunIdParam, query: pageQuery(z.string().max(256)).extend({ status: SampleStatus.optional(), flag: Flag.optional() }) },
  responses: { 200: jsonContent(listOf(Sample, 'SampleList'), 'A page of samples'), ...problemResponses(401, 404, 422) },
});

export function registerListSamples(app: App) {
  app.openapi(route, async (c) => {
    const { db } = c.get('deps');
    const { id } = c.req.valid('param');
    const run = await getRun(db, id);
    if (!run) throw notFound('run', id);
    const q = c.req.valid('query');
    // A custom_id has no order of its own: the cursor is placed by the sample it names, so it must name one.
    await checkCursor(q.after, 'sample of this run', async (after) => (await getSample(db, id, after)) !== undefined);
    const { rows, limit } = await listSamples(db, id, q);
    const conversations = run.regenerate === 'all_assistant';
    const answered = conversations
      ? await answeredTurnCounts(
          db,
          rows.map((s) => s.id),
        )
      : null;
    return c.json(
      page(
        rows,
        limit,
        (s) => s.customId,
        (s) => renderSample(s, variantName(run.variants, s.variant), answered && (answered.get(s.id) ?? 0)),
      ),
      200,
    );
  });
}
