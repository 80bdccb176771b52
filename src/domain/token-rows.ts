import { flagsFromBits, type Flag } from './flags.js';

// Training rows (`output.tokens`): for each generation kept in the output, the server's own token
// ids, prompt then generated, and a loss mask of 0 over the prompt and 1 over the generated ids,
// as a drafter's trainer reads them (vllm-project/speculators' response regeneration writes the same).

/** One generation's ids as the server tokenized them: the prompt it was asked with, and what it generated. */
export interface GenerationIds {
  prompt: number[];
  output: number[];
}

/** A generation's ids as staged with its sample's text until the shard is written: where it stands in the line, and its verdicts. */
export interface StagedIds extends GenerationIds {
  turn: number | null;
  step: number | null;
  finish_reason: string | null;
  flags: number;
}

/**
 * The ids of a conversation's requests that have them, each at its user turn (a turn's steps
 * share it; a text answer ends it, as the line's `turns` count) and step; undefined when none has.
 */
export function conversationIds(
  turns: readonly { step: number; toolCalls: unknown[] | null; finishReason: string | null; flags: number; ids?: GenerationIds | null }[],
): StagedIds[] | undefined {
  const out: StagedIds[] = [];
  let turn = 0;
  for (const t of turns) {
    if (t.ids) out.push({ turn, step: t.step, finish_reason: t.finishReason, flags: t.flags, prompt: t.ids.prompt, output: t.ids.output });
    if (!t.toolCalls) turn++;
  }
  return out.length ? out : undefined;
}

export interface TokenRow {
  custom_id: string;
  sample_index: number;
  /** The user turn (0-based), null for a single prompt. */
  turn: number | null;
  /** The request's place in its user turn: 0 for its first, one more per tool-call step; null for a single prompt. */
  step: number | null;
  variant: string | null;
  split: string | null;
  input_ids: number[];
  loss_mask: number[];
  num_trainable: number;
  finish_reason: string | null;
  flags: Flag[];
}

export interface RowPlace {
  customId: string;
  sampleIndex: number;
  turn: number | null;
  step: number | null;
  variant: string | null;
  split: string | null;
  finishReason: string | null;
  flags: number;
}

export function tokenRow(at: RowPlace, ids: GenerationIds): TokenRow {
  const mask = new Array<number>(ids.prompt.length + ids.output.length).fill(0, 0, ids.prompt.length).fill(1, ids.prompt.length);
  return {
    custom_id: at.customId,
    sample_index: at.sampleIndex,
    turn: at.turn,
    step: at.step,
    variant: at.variant,
    split: at.split,
    input_ids: ids.prompt.concat(ids.output),
    loss_mask: mask,
    num_trainable: ids.output.length,
    finish_reason: at.finishReason,
    flags: flagsFromBits(at.flags),
  };
}

/** The training rows' columns, as the dataset card's `features` (Hugging Face `datasets` types) name them. */
export const TOKEN_FEATURES: readonly Record<string, unknown>[] = [
  { name: 'custom_id', dtype: 'string' },
  { name: 'sample_index', dtype: 'int32' },
  { name: 'turn', dtype: 'int32' },
  { name: 'step', dtype: 'int32' },
  { name: 'variant', dtype: 'string' },
  { name: 'split', dtype: 'string' },
  { name: 'input_ids', sequence: 'int32' },
  { name: 'loss_mask', sequence: 'int8' },
  { name: 'num_trainable', dtype: 'int32' },
  { name: 'finish_reason', dtype: 'string' },
  { name: 'flags', sequence: 'string' },
];

/** A row's identity in its shard: the generation it holds. */
export const tokenRowKey = (r: Pick<TokenRow, 'custom_id' | 'sample_index' | 'turn' | 'step'>): string =>
  `${r.custom_id}\u0000${r.sample_index}\u0000${r.turn ?? ''}\u0000${r.step ?? ''}`;

/** The generation's trainable tokens are too few to teach anything (the `few_trainable` flag), unless its answer was cut. */
export const fewTrainable = (numTrainable: number, finishReason: string | null, least: number): boolean => finishReason !== 'length' && numTrainable < least;

/** min, p5, median, p95, max of the trainable-token counts (nearest rank); null when there are none. */
export interface Spread {
  rows: number;
  min: number;
  p5: number;
  median: number;
  p95: number;
  max: number;
}

export function spreadOf(values: readonly number[]): Spread | null {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
  return { rows: sorted.length, min: sorted[0], p5: at(0.05), median: at(0.5), p95: at(0.95), max: sorted[sorted.length - 1] };
}

/** The spread overall and per variant (by name; rows of no variant count overall only). */
export interface TrainableSpread {
  overall: Spread | null;
  variants: Record<string, Spread | null>;
}

export function trainableSpread(rows: readonly Pick<TokenRow, 'num_trainable' | 'variant'>[]): TrainableSpread {
  const byVariant = new Map<string, number[]>();
  for (const r of rows) {
    if (r.variant === null) continue;
    const values = byVariant.get(r.variant);
    if (values) values.push(r.num_trainable);
    else byVariant.set(r.variant, [r.num_trainable]);
  }
  return {
    overall: spreadOf(rows.map((r) => r.num_trainable)),
    variants: Object.fromEntries([...byVariant].map(([name, values]) => [name, spreadOf(values)])),
  };
}

/** The trainable-token counts of a shard's rows with their variants (shards.tokens_trainable): what the spread is made from. */
export interface ShardTrainable {
  n: number[];
  v: (string | null)[];
}

/** The spread over the rows of the shards written so far, from their stored counts. */
export function shardsSpread(shards: readonly { tokensTrainable: string | null }[]): TrainableSpread {
  const rows: { num_trainable: number; variant: string | null }[] = [];
  for (const s of shards) {
    if (!s.tokensTrainable) continue;
    const t = JSON.parse(s.tokensTrainable) as ShardTrainable;
    for (const [i, n] of t.n.entries()) rows.push({ num_trainable: n, variant: t.v[i] ?? null });
  }
  return trainableSpread(rows);
}
