import { flagsFromBits, type Flag } from './flags.js';

// Training rows (`output.tokens`): for each generation kept in the output, the server's own token
// ids, prompt then generated, and a loss mask of 0 over the prompt and 1 over the generated ids,
// as a drafter's trainer reads them (vllm-project/speculators' response regeneration writes the same).

/** One generation's ids as the server tokenized them: the prompt it was asked with, and what it generated. */
export interface GenerationIds {
  prompt: number[];
  output: number[];
}

/**
 * A list of ids as staged: the base64 of their int32 bytes, written and read whole (a JSON array is
 * written and parsed a number at a time: most of a tokens shard's time, BENCHMARKS.md "Token rows").
 * Rows staged before hold the array itself, read as it was.
 */
export type StagedIdList = string | number[];

/** Where ids are packed: one array, grown to the longest list packed yet, not a new one per list. */
let packing = new Int32Array(1024);

/**
 * Ids in the platform's byte order, little-endian on every machine Node runs regen on. Copied into
 * the one packing array (TypedArray.set, a single native copy) and encoded from it: an array made
 * for each list, its memory found and freed again, took three times as long.
 */
export function packIds(ids: readonly number[]): string {
  if (packing.length < ids.length) packing = new Int32Array(Math.max(ids.length, 2 * packing.length));
  packing.set(ids);
  return Buffer.from(packing.buffer, 0, ids.length * Int32Array.BYTES_PER_ELEMENT).toString('base64');
}

/** How many ids a staged list holds, without decoding it. */
export const idCount = (list: StagedIdList): number =>
  typeof list === 'string' ? Buffer.byteLength(list, 'base64') / Int32Array.BYTES_PER_ELEMENT : list.length;

/** A generation's ids as staged with its sample's text until the shard is written: where it stands in the line, and its verdicts. */
export interface StagedIds {
  turn: number | null;
  step: number | null;
  finish_reason: string | null;
  flags: number;
  /**
   * The ids packed (packIds), under names of their own: a replica of the version that staged arrays
   * as `prompt` and `output`, meeting these during a rolling upgrade, finds no ids and fails the
   * shard's write (asked again once it is gone) instead of writing the text as ids.
   */
  prompt_packed?: string;
  output_packed?: string;
  /** The arrays staged before the ids were packed. */
  prompt?: number[];
  output?: number[];
}

/** A staged generation's prompt ids and generated ids, packed or as arrays. */
export const stagedPrompt = (g: StagedIds): StagedIdList => g.prompt_packed ?? g.prompt ?? [];
export const stagedOutput = (g: StagedIds): StagedIdList => g.output_packed ?? g.output ?? [];

/**
 * Staged lists of ids one after the other in one array, each packed list's base64 decoded straight
 * into it: no array of either list is made on the way (a tokens shard's garbage, BENCHMARKS.md
 * "Token rows").
 */
export function joinIds(...lists: StagedIdList[]): Int32Array {
  const counts = lists.map(idCount);
  if (!counts.every(Number.isInteger)) throw new Error('staged ids are not the base64 of whole int32 values');
  const ids = new Int32Array(counts.reduce((a, b) => a + b, 0));
  const bytes = Buffer.from(ids.buffer);
  let at = 0;
  for (const [i, list] of lists.entries()) {
    const n = counts[i]!;
    if (typeof list !== 'string') ids.set(list, at);
    else if (bytes.write(list, at * Int32Array.BYTES_PER_ELEMENT, 'base64') !== n * Int32Array.BYTES_PER_ELEMENT)
      throw new Error('staged ids are not the base64 of whole int32 values');
    at += n;
  }
  return ids;
}

/**
 * A conversation request's ids as its turn holds them (sample_turns.token_ids) until the
 * conversation is staged whole: packed as staged ids are (a claim reads every earlier turn back as
 * the next one's history, and a turn's prompt ids are the whole conversation before it: parsed as
 * JSON arrays, a number at a time, they cost each claim more the longer the conversation), under the
 * same names. A replica of the version that stored arrays finds no `prompt` or `output` in them and
 * fails the conversation's last request (internal_error, asked again) rather than write base64 as
 * ids (README "Upgrading"). Turns stored before hold the arrays, as `prompt` and `output`.
 */
export type TurnIds = Pick<StagedIds, 'prompt_packed' | 'output_packed' | 'prompt' | 'output'>;

/**
 * The ids of a conversation's requests that have them, each at its user turn (a turn's steps
 * share it; a text answer ends it, as the line's `turns` count) and step; undefined when none has.
 */
export function conversationIds(
  turns: readonly { step: number; toolCalls: unknown[] | null; finishReason: string | null; flags: number; ids?: TurnIds | null }[],
): StagedIds[] | undefined {
  const out: StagedIds[] = [];
  let turn = 0;
  for (const t of turns) {
    if (t.ids) out.push({ turn, step: t.step, finish_reason: t.finishReason, flags: t.flags, ...packedTurnIds(t.ids) });
    if (!t.toolCalls) turn++;
  }
  return out.length ? out : undefined;
}

/** A generation's ids packed for staging, and for its turn's row. */
export const stagedIds = (ids: GenerationIds): Required<Pick<StagedIds, 'prompt_packed' | 'output_packed'>> => ({
  prompt_packed: packIds(ids.prompt),
  output_packed: packIds(ids.output),
});

/** A turn's ids packed: as stored, or the arrays of a turn stored before packed now. */
const packedTurnIds = (ids: TurnIds): Pick<StagedIds, 'prompt_packed' | 'output_packed'> =>
  ids.prompt_packed !== undefined && ids.output_packed !== undefined
    ? { prompt_packed: ids.prompt_packed, output_packed: ids.output_packed }
    : stagedIds({ prompt: ids.prompt ?? [], output: ids.output ?? [] });

/**
 * A training row as its files hold it, but for `loss_mask`: zeros over the prompt, ones over the
 * generated ids (the last num_trainable), it is written from the counts.
 */
export interface TokenRow {
  custom_id: string;
  sample_index: number;
  /** The user turn (0-based), null for a single prompt. */
  turn: number | null;
  /** The request's place in its user turn: 0 for its first, one more per tool-call step; null for a single prompt. */
  step: number | null;
  variant: string | null;
  split: string | null;
  input_ids: Int32Array | number[];
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

/** A row of `inputIds`, the prompt's ids then the generated ones, the last `numTrainable` of them. */
export function tokenRow(at: RowPlace, inputIds: Int32Array | number[], numTrainable: number): TokenRow {
  return {
    custom_id: at.customId,
    sample_index: at.sampleIndex,
    turn: at.turn,
    step: at.step,
    variant: at.variant,
    split: at.split,
    input_ids: inputIds,
    num_trainable: numTrainable,
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
