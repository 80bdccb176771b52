import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, problemResponses } from '../../errors.js';
import { variantName } from '../../domain/variants.js';
import { metadataValues, type StoredMetadata } from '../../domain/output-line.js';
import { getRun } from '../../db/runs.js';
import { getSample } from '../../db/samples.js';
import { listTurns } from '../../db/sample-turns.js';
import { textProblem } from '../../domain/text.js';
import { readSampleOutput } from '../../services/samples.js';
import { jsonContent, RunIdParam } from '../common.js';
import { renderSample, renderTurn } from './render.js';
import { SampleDetail } from './schemas.js';

const route = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/samples/{custom_id}',
  operationId: 'getRunSample',
  tags: ['runs'],
  summary: "A sample's metadata, its request, and its output (from staging or from the uploaded shard)",
  description: 'With params.n > 1 a custom_id names n samples: `sample_index` picks one (0 by default).',
  request: {
    query: z.object({
      sample_index: z.coerce.number().int().min(0).default(0).openapi({ description: "Which of the line's answers (params.n > 1), 0…n−1; 0 by default" }),
    }),
    params: RunIdParam.extend({
      custom_id: z
        .string()
        .min(1)
        .max(512)
        .refine((id) => textProblem(id) === null, 'must not contain the NUL character or an unpaired surrogate')
        .openapi({ param: { name: 'custom_id', in: 'path' } }),
    }),
  },
  responses: { 200: jsonContent(SampleDetail, 'The sample'), ...problemResponses(401, 404, 422, 503) },
});

export function registerGetSample(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { id, custom_id } = c.req.valid('param');
    const { sample_index } = c.req.valid('query');
    const run = await getRun(deps.db, id);
    if (!run) throw notFound('run', id);
    const sample = await getSample(deps.db, id, custom_id, sample_index);
    if (!sample) throw notFound('sample', sample_index === 0 ? custom_id : `${custom_id} (sample_index ${sample_index})`);
    const request = JSON.parse(sample.request) as { messages: unknown[]; params?: Record<string, unknown> } & StoredMetadata;
    const output = await readSampleOutput(deps, run, sample);
    const turns = sample.turn === null ? null : (await listTurns(deps.db, sample.id)).map(renderTurn);
    return c.json(
      {
        ...renderSample(sample),
        messages: request.messages as { role: string; content: unknown }[],
        params: request.params ?? null,
        variant: variantName(run.variants, sample.variant),
        metadata: metadataValues(request) ?? null,
        output,
        ...(turns && { turns }),
      },
      200,
    );
  });
}
