import { z } from '@hono/zod-openapi';
import { readHistory, type SeriesPoint } from '../../db/history.js';
import type { DbOrTx } from '../../db/client.js';
import { fittingStepMs, HISTORY_MAX_POINTS, HISTORY_STEP_MS, resample } from '../../domain/history.js';
import { ApiError } from '../../errors.js';

/** The coarsest step a history answer may ask for: a year (a series' oldest points are 10 minutes). */
const MAX_STEP_SECONDS = 365 * 86_400;

const instant = (what: string) =>
  z
    .string()
    .max(64)
    .refine((s) => Number.isFinite(Date.parse(s)), 'must be a date-time such as 2026-12-02T14:00:00Z')
    .transform((s) => Date.parse(s))
    .optional()
    .openapi({ param: { description: what }, type: 'string', format: 'date-time', example: '2026-12-02T14:00:00Z' });

/** The query of both history routes: a window of the series and the step it is read at. */
export const HistoryQuery = z
  .object({
    since: instant('Only points that start at or after this time'),
    until: instant('Only points that start before this time'),
    step: z.coerce
      .number()
      .int()
      .min(HISTORY_STEP_MS / 1000)
      .max(MAX_STEP_SECONDS)
      .optional()
      .openapi({
        description: `Merge the points into buckets of this many seconds (counts summed, gauges averaged). Without it, the finest multiple of ${HISTORY_STEP_MS / 1000} s that keeps the answer within ${HISTORY_MAX_POINTS.toLocaleString('en-US')} points`,
        example: 60,
      }),
  })
  .refine((q) => q.since === undefined || q.until === undefined || q.since < q.until, { path: ['until'], message: 'must be later than since' });

/** The window's points at the step asked for (or the one that fits), never more than HISTORY_MAX_POINTS. */
export async function readWindow(db: DbOrTx, runId: string | null, q: z.infer<typeof HistoryQuery>): Promise<{ points: SeriesPoint[]; stepSeconds: number }> {
  const stored = await readHistory(db, runId, q);
  const from = q.since ?? stored[0]?.at ?? 0;
  const to = q.until ?? (stored.length ? stored[stored.length - 1].at + stored[stored.length - 1].stepMs : from);
  const stepMs = q.step === undefined ? fittingStepMs(from, to) : q.step * 1000;
  const points = stepMs === HISTORY_STEP_MS ? stored : resample(stored, stepMs).map((p) => ({ ...p, runId }));
  if (points.length > HISTORY_MAX_POINTS) {
    const fits = fittingStepMs(from, to) / 1000;
    throw new ApiError(
      'validation_failed',
      `step: ${q.step} s gives ${points.length.toLocaleString('en-US')} points, more than the ${HISTORY_MAX_POINTS.toLocaleString('en-US')} an answer holds; ask a step of ${fits.toLocaleString('en-US')} s or more, or a narrower since/until`,
      { field: 'step' },
    );
  }
  return { points, stepSeconds: stepMs / 1000 };
}
