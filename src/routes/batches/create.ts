import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { openaiErrorResponses } from '../../errors.js';
import { createBatch } from '../../services/batches/create.js';
import { jsonContent } from '../common.js';
import { renderBatches } from './render.js';
import { Batch, CreateBatchBody } from './schemas.js';

const route = createRoute({
  method: 'post',
  path: '/v1/batches',
  operationId: 'createBatch',
  tags: ['batches'],
  summary: 'Create an OpenAI-compatible batch: a run over the requests of an uploaded file',
  description:
    "The model is the one the file's lines name in `body.model`; each line's other `body` fields override the run's defaults. Invalid lines are listed in `errors` and the error file, the rest run.",
  request: { body: { content: { 'application/json': { schema: CreateBatchBody } }, required: true } },
  responses: { 200: jsonContent(Batch, 'The batch, in status `validating`'), ...openaiErrorResponses(400, 401, 404, 413, 415, 503) },
});

export function registerCreateBatch(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const run = await createBatch(deps, c.req.valid('json'));
    const [batch] = await renderBatches(deps.db, [run]);
    return c.json(batch, 200);
  });
}
