import { asc, eq } from 'drizzle-orm';
import { FLAG_COLUMNS, FLAGS, flagBit } from '../domain/flags.js';
import type { Usage } from '../domain/output-line.js';
import type { DbOrTx } from './client.js';
import type { runVariants } from './schema.js';

// A run's counters per variant (run_variants): laid out at ingest with each variant's samples,
// moved by the result writer in the transaction that moves the run's own counters, and by a retry
// that puts samples back. One row a variant, so the run object reads them without a scan.

export type RunVariantRow = typeof runVariants.$inferSelect;

/** What one batch of outcomes moves on one variant. */
export interface VariantDelta {
  completed: number;
  failed: number;
  flagged: number;
  flags: number[];
  prompt: number;
  completion: number;
  reasoning: number;
  /** Prompt tokens served from the prefix cache: the variant's cache rate over `prompt`. */
  cached: number;
}

export const newVariantDelta = (): VariantDelta => ({
  completed: 0,
  failed: 0,
  flagged: 0,
  flags: FLAGS.map(() => 0),
  prompt: 0,
  completion: 0,
  reasoning: 0,
  cached: 0,
});

/** Adds one outcome to its variant's delta. */
export function addToVariantDelta(d: VariantDelta, kind: 'completed' | 'failed' | 'other', flags: number, usage: Usage | null): void {
  if (kind === 'completed') {
    d.completed++;
    if (flags) d.flagged++;
    for (const [f, flag] of FLAGS.entries()) if (flags & flagBit(flag)) d.flags[f]++;
  } else if (kind === 'failed') d.failed++;
  if (usage) {
    d.prompt += usage.prompt_tokens;
    d.completion += usage.completion_tokens;
    d.reasoning += usage.reasoning_tokens;
    d.cached += usage.cached_tokens;
  }
}

const MOVE = `update run_variants set completed = completed + ?, failed = failed + ?, flagged = flagged + ?,
   ${FLAG_COLUMNS.map(({ column }) => `${column} = ${column} + ?`).join(', ')},
   prompt_tokens = prompt_tokens + ?, completion_tokens = completion_tokens + ?, reasoning_tokens = reasoning_tokens + ?,
   cached_tokens = cached_tokens + ? where run_id = ? and idx = ?`;

/** Moves one variant's counters by a delta (negative to take back); call inside the writer's transaction. */
export async function moveVariantCounters(tx: DbOrTx, runId: string, idx: number, d: VariantDelta): Promise<void> {
  await tx.exec(MOVE, [d.completed, d.failed, d.flagged, ...d.flags, d.prompt, d.completion, d.reasoning, d.cached, runId, idx]);
}

/** The variants' rows of a run, each with its sample count, as ingest lays them out (replacing any earlier ones). */
export async function insertRunVariants(tx: DbOrTx, runId: string, totals: readonly number[]): Promise<void> {
  const { runVariants } = tx.t;
  await tx.write(async (w) => {
    await w.q.delete(runVariants).where(eq(runVariants.runId, runId));
    if (totals.length) await w.q.insert(runVariants).values(totals.map((total, idx) => ({ runId, idx, total })));
  });
}

export async function deleteRunVariants(tx: DbOrTx, runId: string): Promise<void> {
  const { runVariants } = tx.t;
  await tx.write((w) => w.q.delete(runVariants).where(eq(runVariants.runId, runId)));
}

/** A run's variant counters, by index. */
export async function listRunVariants(db: DbOrTx, runId: string): Promise<RunVariantRow[]> {
  const { runVariants } = db.t;
  return await db.q.select().from(runVariants).where(eq(runVariants.runId, runId)).orderBy(asc(runVariants.idx));
}
