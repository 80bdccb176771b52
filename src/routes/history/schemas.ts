import { z } from '@hono/zod-openapi';
import type { SeriesPoint } from '../../db/history.js';
import { pointRates } from '../../domain/history.js';
import { iso, Timestamp } from '../common.js';

const Rates = {
  at: Timestamp.openapi({ description: 'Start of the time the point covers' }),
  span_seconds: z
    .number()
    .openapi({ description: 'How long it covers: 5 s for the last hour, 1 min for the last day, 10 min before (less where the server was down)' }),
  samples: z.number().int().openapi({ description: 'Samples completed within it' }),
  samples_per_second: z
    .number()
    .openapi({ description: 'Samples completed per second of the span: the same rate as a run’s `progress.samples_per_second`, averaged' }),
  completion_tokens_per_second: z.number(),
  cache_hit_rate: z.number().nullable().openapi({ description: 'Prompt tokens served from the prefix cache ÷ prompt tokens; null where no answer came in' }),
};

export const StepSeconds = z.number().int().openapi({
  description:
    'The step the points were merged to (`step`, or the one chosen to fit): a point covers at most this, or its own span where the stored point is coarser',
});

export const RunHistoryPoint = z.object(Rates).openapi('RunHistoryPoint');

export const FleetHistoryPoint = z
  .object({
    ...Rates,
    in_flight: z.number().openapi({ description: 'Requests sent and not yet answered, averaged over the span' }),
    cap: z.number().openapi({ description: 'The sum of the dispatchable endpoints’ caps, averaged over the span' }),
    endpoints: z.array(z.object({ endpoint_id: z.string(), in_flight: z.number(), cap: z.number() })),
  })
  .openapi('FleetHistoryPoint');

const round = (n: number) => Math.round(n * 1000) / 1000;

export function renderRunPoint(p: SeriesPoint): z.infer<typeof RunHistoryPoint> {
  const r = pointRates(p);
  return {
    at: iso(p.at)!,
    span_seconds: p.spanMs / 1000,
    samples: p.samples,
    samples_per_second: round(r.samplesPerSecond),
    completion_tokens_per_second: round(r.completionTokensPerSecond),
    cache_hit_rate: r.cacheHitRate === null ? null : round(r.cacheHitRate),
  };
}

export function renderFleetPoint(p: SeriesPoint): z.infer<typeof FleetHistoryPoint> {
  return {
    ...renderRunPoint(p),
    in_flight: round(p.inFlight ?? 0),
    cap: round(p.cap ?? 0),
    endpoints: Object.entries(p.endpoints ?? {}).map(([endpoint_id, [inFlight, cap]]) => ({ endpoint_id, in_flight: round(inFlight), cap: round(cap) })),
  };
}
