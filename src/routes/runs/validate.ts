import { createRoute } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { validateRun } from '../../services/runs/validate.js';
import { jsonContent } from '../common.js';
import { RunValidation, ValidateRunBody } from './schemas.js';

const route = createRoute({
  method: 'post',
  path: '/v1/runs/validate',
  operationId: 'validateRun',
  tags: ['runs'],
  summary: 'Check a run body without creating the run',
  description:
    'Answers as `POST /v1/runs` would (the same 4xx for a body it would refuse), but stores nothing. Leave `input` out to check the rest before uploading the input file; its lines are read only once the run is created.',
  request: { body: { content: { 'application/json': { schema: ValidateRunBody } }, required: true } },
  responses: {
    200: jsonContent(RunValidation, 'The body would create a run; `warnings` says what the run would carry'),
    ...problemResponses(400, 401, 404, 409, 413, 422),
  },
});

export function registerValidateRun(app: App) {
  app.openapi(route, async (c) => {
    const warnings = await validateRun(c.get('deps'), c.req.valid('json'));
    return c.json({ object: 'run.validation' as const, warnings }, 200);
  });
}
