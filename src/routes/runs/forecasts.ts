import { createRoute, z } from '@hono/zod-openapi';
import type { App } from '../../http/app.js';
import { notFound, problemResponses } from '../../errors.js';
import { forecastHistory } from '../../db/forecasts.js';
import { getRun } from '../../db/runs.js';
import { iso, jsonContent, RunIdParam, Timestamp } from '../common.js';

const ForecastPoint = z
  .object({
    at: Timestamp,
    fraction: z.number().openapi({ description: 'Share of the samples done when the forecast was made' }),
    finishes_at: Timestamp.nullable(),
    low: Timestamp.nullable().openapi({ description: 'The earliest finish of the 90% interval' }),
    high: Timestamp.nullable().openapi({ description: 'The latest finish of the 90% interval' }),
    completion_tokens_estimate: z.number().int(),
  })
  .openapi('ForecastPoint');

const ForecastHistory = z
  .object({ object: z.literal('list'), run_id: z.string(), data: z.array(ForecastPoint) })
  .openapi('ForecastHistory', { description: 'Oldest first: a point every few seconds at the start, thinning to about 1/200 of the elapsed time' });

const route = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/forecasts',
  operationId: 'listRunForecasts',
  tags: ['runs'],
  summary: "How a run's forecast moved: projected finish and its interval over time",
  request: { params: RunIdParam },
  responses: { 200: jsonContent(ForecastHistory, 'The forecast history'), ...problemResponses(401, 404, 422) },
});

export function registerRunForecasts(app: App) {
  app.openapi(route, async (c) => {
    const { db } = c.get('deps');
    const { id } = c.req.valid('param');
    if (!(await getRun(db, id))) throw notFound('run', id);
    const data = (await forecastHistory(db, id)).map((p) => ({
      at: iso(p.at)!,
      fraction: p.fraction,
      finishes_at: iso(p.finishesAt),
      low: iso(p.lowAt),
      high: iso(p.highAt),
      completion_tokens_estimate: p.completionTokensEstimate,
    }));
    return c.json({ object: 'list' as const, run_id: id, data }, 200);
  });
}
