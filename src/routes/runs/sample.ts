import { createRoute, z } from '@hono/zod-openapi';
import type { Deps } from '../../deps.js';
import type { App } from '../../http/app.js';
import { notFound, problemResponses } from '../../errors.js';
import { variantName } from '../../domain/variants.js';
import { metadataValues, type StoredMetadata } from '../../domain/output-line.js';
import { getRun } from '../../db/runs.js';
import { getSample } from '../../db/samples.js';
import { listTurns } from '../../db/sample-turns.js';
import { turnLines, walk, type TurnRecord, type WalkSettings } from '../../domain/conversation.js';
import { shardObjectKey, splitOfShardIdx, type OutputFormat } from '../../domain/output-format.js';
import { walkSettings } from '../../domain/run-settings.js';
import { textProblem } from '../../domain/text.js';
import { readSampleOutput, readTrainable } from '../../services/samples.js';
import { jsonContent, RunIdParam } from '../common.js';
import { renderSample, renderTurn } from './render.js';
import { SampleDetail } from './schemas.js';

const CustomId = z
  .string()
  .min(1)
  .max(512)
  .refine((id) => textProblem(id) === null, 'must not contain the NUL character or an unpaired surrogate');

const SampleIndex = z.coerce.number().int().min(0).default(0).openapi({ description: "Which of the line's answers (params.n > 1), 0…n−1; 0 by default" });

const route = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/samples/{custom_id}',
  operationId: 'getRunSample',
  tags: ['runs'],
  summary: "A sample's metadata, its request, and its output (from staging or from the uploaded shard)",
  description:
    'With params.n > 1 a custom_id names n samples: `sample_index` picks one (0 by default). A custom_id of `.` or `..` cannot travel in a path (clients remove such segments): ask `GET /v1/runs/{id}/sample?custom_id=` for it.',
  request: {
    query: z.object({ sample_index: SampleIndex }),
    params: RunIdParam.extend({ custom_id: CustomId.openapi({ param: { name: 'custom_id', in: 'path' } }) }),
  },
  responses: { 200: jsonContent(SampleDetail, 'The sample'), ...problemResponses(401, 404, 422, 503) },
});

const byQuery = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/sample',
  operationId: 'findRunSample',
  tags: ['runs'],
  summary: 'A sample by its custom_id given as a query parameter: any custom_id, `.` and `..` too',
  request: {
    query: z.object({ custom_id: CustomId, sample_index: SampleIndex }),
    params: RunIdParam,
  },
  responses: { 200: jsonContent(SampleDetail, 'The sample'), ...problemResponses(401, 404, 422, 503) },
});

async function sampleDetail(deps: Deps, id: string, customId: string, sampleIndex: number) {
  const run = await getRun(deps.db, id);
  if (!run) throw notFound('run', id);
  const sample = await getSample(deps.db, id, customId, sampleIndex);
  if (!sample) throw notFound('sample', sampleIndex === 0 ? customId : `${customId} (sample_index ${sampleIndex})`);
  const request = JSON.parse(sample.request) as { messages: unknown[]; params?: Record<string, unknown> } & StoredMetadata;
  const output = await readSampleOutput(deps, run, sample);
  const records = sample.turn === null ? null : await listTurns(deps.db, sample.id);
  const turns = records && turnLines(records).map((line, i) => renderTurn(records[i], line.turn));
  const split = run.evalShare === null ? null : splitOfShardIdx(sample.shardIdx);
  return {
    ...renderSample(sample, variantName(run.variants, sample.variant), records?.length ?? null),
    // A completions or embeddings run's request is a raw prompt or an input, not messages.
    messages: (request.messages ?? []) as { role: string; content: unknown }[],
    params: request.params ?? null,
    metadata: metadataValues(request) ?? null,
    output,
    ...(records && turns && { turns, conversation: conversationOf(request.messages as { role: string }[], records, walkSettings(run)) }),
    split,
    shard_key: shardObjectKey({ idx: sample.shardIdx, split }, run.outputFormat as OutputFormat),
    trainable_tokens: await readTrainable(deps, run, sample),
  };
}

/**
 * The regenerated conversation with each answer marked by the request it came from: the walk puts
 * the answered requests' messages in order, so the k-th assistant message is the k-th request.
 */
function conversationOf(messages: readonly { role: string }[], records: readonly TurnRecord[], settings: WalkSettings) {
  let request = 0;
  return walk(messages, records, settings).messages.map((m) => (m.role === 'assistant' ? { ...m, request: request++ } : m));
}

export function registerGetSample(app: App) {
  app.openapi(route, async (c) => {
    const { id, custom_id } = c.req.valid('param');
    return c.json(await sampleDetail(c.get('deps'), id, custom_id, c.req.valid('query').sample_index), 200);
  });
  app.openapi(byQuery, async (c) => {
    const { custom_id, sample_index } = c.req.valid('query');
    return c.json(await sampleDetail(c.get('deps'), c.req.valid('param').id, custom_id, sample_index), 200);
  });
}
