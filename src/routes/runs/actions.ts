import { createRoute, z } from '@hono/zod-openapi';
import type { Context } from 'hono';
import type { App, AppEnv } from '../../http/app.js';
import { listRunVariants } from '../../db/run-variants.js';
import type { RunRow } from '../../db/schema.js';
import { problemResponses } from '../../errors.js';
import { cancelRun, pauseRun, resumeRun, retryRun } from '../../services/runs/actions.js';
import { jsonContent, RunIdParam } from '../common.js';
import { renderRun } from './render.js';
import { Run } from './schemas.js';

const ResumeBody = z.object({ override_gate: z.boolean().optional() }).strict().openapi('ResumeRun');
const RetryBody = z
  .object({ only: z.enum(['failed', 'flagged']).optional() })
  .strict()
  .openapi('RetryRun');

const action = <B extends z.ZodTypeAny>(name: string, summary: string, body: B) =>
  createRoute({
    method: 'post',
    path: `/v1/runs/{id}/${name}`,
    // pauseRun, resumeRun, cancelRun, retryRun
    operationId: `${name}Run`,
    tags: ['runs'],
    summary,
    request: { params: RunIdParam, body: { content: { 'application/json': { schema: body } }, required: false } },
    responses: { 200: jsonContent(Run, 'The run after the change'), ...problemResponses(400, 401, 404, 409, 413, 422) },
  });

const Empty = z.object({}).strict();

export function registerRunActions(app: App) {
  const respond = async (c: Context<AppEnv>, id: string, run: RunRow) => {
    const deps = c.get('deps');
    const variants = run.variants?.length ? await listRunVariants(deps.db, id) : [];
    return c.json(renderRun(run, deps.runner.runProgress(id), deps.clock(), variants), 200);
  };
  app.openapi(action('pause', 'Pause a run: no new dispatch, in-flight requests finish', Empty), async (c) => {
    const { id } = c.req.valid('param');
    return respond(c, id, await pauseRun(c.get('deps'), id));
  });
  app.openapi(action('resume', 'Resume a paused run; `override_gate` keeps the quality gate quiet for this run', ResumeBody), async (c) => {
    const { id } = c.req.valid('param');
    const body = (c.req.valid('json') ?? {}) as z.infer<typeof ResumeBody>;
    return respond(c, id, await resumeRun(c.get('deps'), id, body.override_gate === true));
  });
  app.openapi(action('cancel', 'Cancel a run: in-flight requests are aborted, completed samples are still written', Empty), async (c) => {
    const { id } = c.req.valid('param');
    return respond(c, id, await cancelRun(c.get('deps'), id));
  });
  app.openapi(action('retry', 'Re-queue failed (or flagged) samples and reopen their shards', RetryBody), async (c) => {
    const { id } = c.req.valid('param');
    const body = (c.req.valid('json') ?? {}) as z.infer<typeof RetryBody>;
    return respond(c, id, (await retryRun(c.get('deps'), id, body.only ?? 'failed')).run);
  });
}
