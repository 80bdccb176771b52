import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { createRun } from '../../services/runs/create.js';
import { modelWarnings } from '../../services/runs/validate.js';
import { jsonContent } from '../common.js';
import { renderRun } from './render.js';
import { CreateRunBody, Run } from './schemas.js';

const route = createRoute({
  method: 'post',
  path: '/v1/runs',
  operationId: 'createRun',
  tags: ['runs'],
  summary: 'Create a regeneration run',
  description: 'Validates the input in the background (status `validating`), then queues the run. Send an `Idempotency-Key` to make retries safe.',
  request: {
    headers: z.object({ 'idempotency-key': z.string().min(1).max(256).optional() }),
    body: { content: { 'application/json': { schema: CreateRunBody } }, required: true },
  },
  responses: {
    201: jsonContent(Run, 'The run, in status `validating` (or as first created, for a replayed Idempotency-Key), with its `warnings`'),
    ...problemResponses(400, 401, 404, 409, 413, 422),
  },
});

export function registerCreateRun(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { run, replayed } = await createRun(deps, c.req.valid('json'), c.req.valid('header')['idempotency-key']);
    if (replayed) c.header('Idempotent-Replayed', 'true');
    const warnings = await modelWarnings(deps.db, run.model);
    for (const w of warnings) deps.logger.warn({ run_id: run.id, field: w.field }, w.message);
    return c.json({ ...renderRun(run, deps.runner.runProgress(run.id), deps.clock()), warnings }, 201);
  });
}
