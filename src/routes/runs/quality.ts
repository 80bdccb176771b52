import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, problemResponses } from '../../errors.js';
import { getRun } from '../../db/runs.js';
import { flagExamples, HISTOGRAM_EDGES, qualityHistograms } from '../../db/quality.js';
import { recentCompleted } from '../../db/samples.js';
import { FLAGS, flagCounts } from '../../domain/flags.js';
import { thinkingRequested } from '../../domain/run-settings.js';
import { gateSettings, gateTripped, overLimit, stopsLoops } from '../../domain/quality.js';
import { QUALITY_WINDOW } from '../../domain/quality-window.js';
import { RunQuality as RunChecks } from '../../domain/run-quality.js';
import { jsonContent, RunIdParam } from '../common.js';
import { RunStatus } from './schemas.js';

const EXAMPLES_PER_FLAG = 5;

const edgesText = (name: keyof typeof HISTOGRAM_EDGES) => HISTOGRAM_EDGES[name].join(', ');

const Histogram = z
  .object({
    samples: z.number().int().openapi({ description: 'Completed samples counted' }),
    buckets: z.array(z.object({ ge: z.number().int(), lt: z.number().int().nullable(), count: z.number().int() })),
  })
  .openapi('QualityHistogram', { description: 'Buckets [ge, lt); the last has lt null (open-ended).' });

const FlagStats = z
  .object({
    count: z.number().int(),
    share: z.number().openapi({ description: 'count / completed' }),
    examples: z.array(z.string()).openapi({ description: `custom_ids of the first ${EXAMPLES_PER_FLAG} samples with the flag, in input order` }),
  })
  .openapi('QualityFlagStats');

const SettingsInForce = z
  .union([
    z.literal(false),
    z.object({
      min_completion_tokens: z.number().int(),
      retry_flagged: z.number().int(),
      gate: z.union([z.literal(false), z.object({ min_samples: z.number().int(), max_flag_rate: z.number() })]),
      stop_loops: z.boolean(),
      min_trainable_tokens: z.number().int().optional(),
    }),
  ])
  .openapi({ description: "The run's quality settings with defaults filled in; false when checks are off" });

const Loops = z
  .object({
    enabled: z.boolean().openapi({ description: 'Answers are streamed and cut once they loop (settings.stop_loops)' }),
    stopped: z.number().int().openapi({ description: 'Answers cut because they looped, re-asked ones included' }),
    tokens_saved: z
      .number()
      .int()
      .openapi({
        description:
          "Tokens not generated thanks to the cuts: each cut answer's max_tokens (the server's context length when the request sets none) " +
          'less the tokens streamed before the cut, counted one an event (SGLang streams a token an event by default)',
      }),
  })
  .openapi('QualityLoops');

const EndpointQuality = z
  .object({
    endpoint_id: z.string(),
    samples: z.number().int().openapi({ description: "The endpoint's completed samples among the run's window" }),
    flagged: z.number().int(),
    share: z.number().openapi({ description: 'flagged / samples' }),
    top_flag: z.enum(FLAGS).nullable().openapi({ description: 'The flag most of its flagged answers carry' }),
  })
  .openapi('QualityEndpoint');

const RunQuality = z
  .object({
    object: z.literal('run.quality'),
    run_id: z.string(),
    status: RunStatus,
    completed: z.number().int().openapi({ description: 'Completed samples: the base of every share' }),
    flagged: z.number().int(),
    flagged_share: z.number(),
    by_flag: z.object(Object.fromEntries(FLAGS.map((f) => [f, FlagStats])) as Record<(typeof FLAGS)[number], typeof FlagStats>),
    settings: SettingsInForce,
    thinking_requested: z
      .boolean()
      .openapi({ description: "Whether missing_reasoning is checked: the run's params turn thinking on (a line's own params may differ)" }),
    gate: z.object({
      enabled: z.boolean(),
      overridden: z.boolean().openapi({ description: 'Resumed with override_gate: the gate stays quiet for this run' }),
      tripped: z.boolean().openapi({ description: 'The run is paused by the gate' }),
      over_limit: z.boolean().openapi({ description: 'min_samples are done and the flagged share is above max_flag_rate' }),
      status_reason: z.string().nullable(),
    }),
    loops: Loops,
    endpoints: z.array(EndpointQuality).openapi({
      description:
        `Each endpoint's flagged share over the run's last ${QUALITY_WINDOW} completed samples, the most flagged first: ` +
        'the windows the quarantine judges, as they are rebuilt after a restart. A quarantined endpoint has its flagged answers asked again elsewhere, so only its kept ones remain here.',
    }),
    histograms: z.object({ completion_tokens: Histogram, reasoning_chars: Histogram, content_chars: Histogram }).openapi({
      description:
        'Over completed samples, with fixed bucket edges. completion_tokens (reasoning included): ' +
        `${edgesText('completion_tokens')}. reasoning_chars, the length of reasoning_content: ${edgesText('reasoning_chars')}. ` +
        `content_chars, the length of content: ${edgesText('content_chars')}. Lengths count UTF-16 code units.`,
    }),
  })
  .openapi('RunQuality');

const route = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/quality',
  operationId: 'getRunQuality',
  tags: ['runs'],
  summary: "A run's quality: flag counts and shares with examples, the gate's state, and length histograms of its completed samples",
  request: { params: RunIdParam },
  responses: { 200: jsonContent(RunQuality, "The run's quality report"), ...problemResponses(401, 404, 422) },
});

const share = (part: number, whole: number) => (whole ? Math.round((part / whole) * 10_000) / 10_000 : 0);

/** The endpoint windows the quarantine judges, rebuilt from the database as after a restart (QualityWatch.qualityOf). */
async function endpointShares(db: Parameters<typeof recentCompleted>[0], runId: string, completed: number, model: string) {
  const checks = new RunChecks({ min_completion_tokens: 0, model });
  checks.restore(await recentCompleted(db, runId, QUALITY_WINDOW), completed, []);
  return checks
    .endpointShares()
    .map((e) => ({ endpoint_id: e.endpointId, samples: e.samples, flagged: e.flagged, share: share(e.flagged, e.samples), top_flag: e.topFlag }));
}

export function registerRunQuality(app: App) {
  app.openapi(route, async (c) => {
    const { db } = c.get('deps');
    const { id } = c.req.valid('param');
    const run = await getRun(db, id);
    if (!run) throw notFound('run', id);
    const counts = flagCounts(run);
    const gate = gateSettings(run);
    const byFlag = Object.fromEntries(
      await Promise.all(
        FLAGS.map(async (f) => [
          f,
          { count: counts[f], share: share(counts[f], run.completed), examples: counts[f] ? await flagExamples(db, id, f, EXAMPLES_PER_FLAG) : [] },
        ]),
      ),
    ) as z.infer<typeof RunQuality>['by_flag'];
    return c.json(
      {
        object: 'run.quality' as const,
        run_id: run.id,
        status: run.status as z.infer<typeof RunStatus>,
        completed: run.completed,
        flagged: run.flagged,
        flagged_share: share(run.flagged, run.completed),
        by_flag: byFlag,
        settings: run.quality ? { ...run.quality, stop_loops: stopsLoops(run.quality) } : false,
        thinking_requested: thinkingRequested(run.params, run.model),
        gate: {
          enabled: gate !== null,
          overridden: run.gateOverridden,
          tripped: gateTripped(run),
          over_limit: gate !== null && overLimit(run, gate),
          status_reason: run.statusReason,
        },
        loops: { enabled: stopsLoops(run.quality), stopped: run.loopsStopped, tokens_saved: run.loopTokensSaved },
        endpoints: run.quality ? await endpointShares(db, run.id, run.completed, run.model) : [],
        histograms: await qualityHistograms(db, id),
      },
      200,
    );
  });
}
