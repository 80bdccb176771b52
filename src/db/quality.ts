import type { Db } from './client.js';
import { flagBit, type Flag } from '../domain/flags.js';

/**
 * Lower bucket edges of the quality histograms; each bucket is [edge, next edge) and the last is
 * open-ended. Fixed, so histograms of different runs (and of one run over time) compare directly.
 * The first bucket, [0, 1), holds the empty answers and empty think blocks.
 */
export const HISTOGRAM_EDGES = {
  completion_tokens: [0, 1, 16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768],
  reasoning_chars: [0, 1, 64, 256, 1024, 4096, 8192, 16384, 32768, 65536, 131072],
  content_chars: [0, 1, 64, 256, 1024, 4096, 8192, 16384, 32768, 65536, 131072],
} as const;
export type HistogramName = keyof typeof HISTOGRAM_EDGES;
const NAMES = Object.keys(HISTOGRAM_EDGES) as HistogramName[];

export interface Histogram {
  /** Completed samples with a value (samples completed before lengths were recorded have none). */
  samples: number;
  buckets: { ge: number; lt: number | null; count: number }[];
}

// Each bucket is one range count over samples_<column>_idx, a narrow partial index of completed
// samples: together they walk each index's entries for the run once and never read a row. On 1M
// samples this takes ~0.1 s; one pass testing every edge on every row took ~1.1 s.
const histogramTerms = NAMES.flatMap((col) =>
  HISTOGRAM_EDGES[col].map((ge, i) => {
    const lt = HISTOGRAM_EDGES[col][i + 1];
    const range = lt === undefined ? `${col} >= ${ge}` : `${col} >= ${ge} and ${col} < ${lt}`;
    return `(select count(*) from samples where run_id = ? and status = 'completed' and ${range})`;
  }),
);
const histogramSql = `select ${histogramTerms.map((term, i) => `${term} as c${i}`).join(', ')}`;

export async function qualityHistograms(db: Db, runId: string): Promise<Record<HistogramName, Histogram>> {
  const { rows } = await db.exec<Record<string, number | string>>(
    histogramSql,
    histogramTerms.map(() => runId),
  );
  const counts = histogramTerms.map((_, i) => Number(rows[0][`c${i}`]));
  const out = {} as Record<HistogramName, Histogram>;
  let at = 0;
  for (const col of NAMES) {
    const edges = HISTOGRAM_EDGES[col];
    const buckets = edges.map((ge, i) => ({ ge, lt: edges[i + 1] ?? null, count: counts[at + i] }));
    at += edges.length;
    out[col] = { samples: buckets.reduce((n, b) => n + b.count, 0), buckets };
  }
  return out;
}

/**
 * The lines (custom_ids) of the first `limit` flagged samples in input order. The literal bit makes the term match the
 * partial index samples_flag_<flag>_idx, which holds only samples with that flag, so the walk
 * stops after `limit` index entries however rare the flag is.
 */
export async function flagExamples(db: Db, runId: string, flag: Flag, limit: number): Promise<string[]> {
  const { rows } = await db.exec<{ custom_id: string }>(
    `select custom_id from samples where run_id = ? and (flags & ${flagBit(flag)}) <> 0 order by seq limit ?`,
    [runId, limit],
  );
  // With params.n > 1 a line may have several flagged answers: it is named once.
  return [...new Set(rows.map((r) => r.custom_id))];
}
