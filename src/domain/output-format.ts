import type { SplitName } from './assign.js';
import { objectMembers, RawJson, stringifyExact } from './exact-json.js';
import { MANIFEST_KEY } from './output-line.js';

// How a run's shards are written (README "Output formats"). Every format starts from the same
// output line (output-line.ts): `jsonl` writes it as is, `conversations` reshapes it into the line
// SpecForge's regenerate_train_data.py writes, `parquet` into one typed row. The reshaping reads
// the line's fields by name, so a field the line gains is carried wherever a column or key names it.

export const OUTPUT_FORMATS = ['jsonl', 'conversations', 'parquet'] as const;
export type OutputFormat = (typeof OUTPUT_FORMATS)[number];

export const isOutputFormat = (s: string): s is OutputFormat => (OUTPUT_FORMATS as readonly string[]).includes(s);

/** Written beside the shards of a run in a dataset format (parquet, or any run with a split). */
export const CARD_KEY = 'README.md';

/** A run writes a dataset card unless it is a plain JSONL run without a split or training rows (its output stays as it always was). */
export const writesCard = (format: OutputFormat, evalShare: number | null, tokens = false): boolean => format !== 'jsonl' || evalShare !== null || tokens;

/**
 * The beginnings of the keys a run writes at its prefix (a name, or a folder ending in `/`): shards
 * and their error files, the manifest, the card (for a run that writes one), the splits' folders,
 * and `tokens/` and `export…`, kept for a run's token files and exports. A prefix that already holds
 * one, and that no run owns, holds someone's data the run would replace.
 */
export function writtenKeyStarts(format: OutputFormat, evalShare: number | null, tokens = false): string[] {
  return ['shard-', MANIFEST_KEY, ...(writesCard(format, evalShare, tokens) ? [CARD_KEY] : []), 'train/', 'eval/', 'tokens/', 'export'];
}

// A split run numbers its shards per split; the shard's index in the run interleaves the two, so
// that either split can add a shard during ingestion without knowing how many the other will have.
export const splitShardIdx = (split: SplitName, local: number): number => local * 2 + (split === 'eval' ? 1 : 0);
export const splitOfShardIdx = (idx: number): SplitName => (idx % 2 === 1 ? 'eval' : 'train');
const localIdx = (idx: number, split: string | null) => (split === null ? idx : Math.floor(idx / 2));

function baseName(shard: { idx: number; split: string | null }): string {
  const name = `shard-${String(localIdx(shard.idx, shard.split)).padStart(5, '0')}`;
  return shard.split === null ? name : `${shard.split}/${name}`;
}

/** The shard's object: `[train/|eval/]shard-NNNNN.{jsonl|parquet}` (conversations are JSONL too). */
export const shardObjectKey = (shard: { idx: number; split: string | null }, format: OutputFormat): string =>
  `${baseName(shard)}.${format === 'parquet' ? 'parquet' : 'jsonl'}`;

/** The training rows beside a shard (output.tokens): `tokens/[train/|eval/]shard-NNNNN.{jsonl|parquet}`, JSONL for both text formats. */
export const tokensObjectKey = (shard: { idx: number; split: string | null }, format: OutputFormat): string => `tokens/${shardObjectKey(shard, format)}`;

/** Failed samples' lines stay JSONL in every format. */
export const shardErrorsObjectKey = (shard: { idx: number; split: string | null }): string => `${baseName(shard)}.errors.jsonl`;

/** An output line as the reshaping reads it: today's fields, and those other features add when present. */
export interface LineFields {
  custom_id: string;
  messages: unknown[];
  content: string | null;
  reasoning_content: string | null;
  finish_reason: string | null;
  usage: { prompt_tokens: number; completion_tokens: number; reasoning_tokens: number; cached_tokens: number };
  model: string;
  endpoint_id: string | null;
  latency_ms: number | null;
  attempts: number;
  flags: string[];
  variant?: string | null;
  sample_index?: number | null;
  metadata?: Record<string, unknown> | null;
  /** Present on a conversation regenerated turn by turn: `messages` is then the regenerated conversation. */
  turns?: unknown[] | null;
  /** The tools the line offered, and a plain answer's calls. */
  tools?: unknown[] | null;
  tool_calls?: unknown[] | null;
}

type Msg = { role?: unknown; content?: unknown; reasoning_content?: unknown; tool_calls?: unknown; tool_call_id?: unknown };

/** The conversation a line ends with: the regenerated one as is, else the prompt and the new answer. */
function conversation(line: LineFields): Msg[] {
  const messages = line.messages as Msg[];
  if (line.turns) return messages;
  const answer: Msg = { role: 'assistant', content: line.content };
  if (line.reasoning_content !== null) answer.reasoning_content = line.reasoning_content;
  if (line.tool_calls) answer.tool_calls = line.tool_calls;
  return [...messages, answer];
}

/**
 * Flags that make a line unfit to train on as SpecForge reads it (its validator refuses an empty
 * answer; a cut one, by max_tokens or by the loop watch, is not the model's whole answer).
 */
export const SPECFORGE_ERROR_FLAGS: readonly string[] = ['truncated', 'empty_content', 'repetitive'];

/**
 * SpecForge's regenerated line: the input object (its own fields, kept as `metadata`, with the
 * `id`, a number again when the input's was) whose `conversations` are the regenerated ones, each
 * answer with its `reasoning_content` beside it, and `status`: `"success"`, or `"error"` with the
 * line's `flags` when an answer was cut or empty (SpecForge's tools read `status`; failed samples
 * go to the errors file, as SpecForge's do).
 */
export function conversationsLine(line: LineFields, numericId = false): Record<string, unknown> {
  const out: Record<string, unknown> = { ...(line.metadata ?? {}), id: numericId ? new RawJson(line.custom_id) : line.custom_id };
  // regen's own keys win over the input's fields of the same name (a line of regen's output fed
  // back in carries them): `sample_index` is written whenever a field could be taken for it.
  if (line.variant != null) out.variant = line.variant;
  else delete out.variant;
  const index = line.sample_index ?? 0;
  if (index > 0 || 'sample_index' in out) out.sample_index = index;
  out.conversations = conversation(line).map((m) => {
    const msg: Msg = { role: m.role, content: m.content };
    if (typeof m.reasoning_content === 'string') msg.reasoning_content = m.reasoning_content;
    if (m.tool_calls !== undefined && m.tool_calls !== null) msg.tool_calls = m.tool_calls;
    if (m.tool_call_id !== undefined) msg.tool_call_id = m.tool_call_id;
    return msg;
  });
  if (line.tools) out.tools = line.tools;
  const unfit = line.flags.some((f) => SPECFORGE_ERROR_FLAGS.includes(f));
  out.status = unfit ? 'error' : 'success';
  if (unfit) out.flags = line.flags;
  else delete out.flags;
  return out;
}

/** A tool call as a Parquet struct. */
export interface ParquetCall {
  id: string | null;
  type: string | null;
  name: string | null;
  arguments: string | null;
}

export interface ParquetRow {
  custom_id: string;
  messages: {
    role: string | null;
    content: string | null;
    reasoning_content: string | null;
    tool_calls: ParquetCall[] | null;
    tool_call_id: string | null;
  }[];
  content: string | null;
  reasoning_content: string | null;
  finish_reason: string | null;
  usage: { prompt_tokens: number; completion_tokens: number; reasoning_tokens: number; cached_tokens: number };
  flags: string[];
  variant: string | null;
  sample_index: number | null;
  split: string | null;
  metadata: string | null;
  turns: string | null;
  endpoint_id: string | null;
  latency_ms: number | null;
  attempts: number;
  model: string;
  /** The line's tools as JSON text, and a plain answer's calls. */
  tools: string | null;
  tool_calls: ParquetCall[] | null;
}

function parquetCalls(calls: unknown): ParquetCall[] | null {
  if (!Array.isArray(calls)) return null;
  return calls.map((c) => {
    const call = (c ?? {}) as { id?: unknown; type?: unknown; function?: { name?: unknown; arguments?: unknown } };
    return { id: text(call.id), type: text(call.type), name: text(call.function?.name), arguments: text(call.function?.arguments) };
  });
}

const text = (v: unknown): string | null => (v == null ? null : typeof v === 'string' ? v : JSON.stringify(v));

/** The line as one Parquet row: content given as parts is kept as its JSON text, objects as JSON text. */
export function parquetRow(line: LineFields, split: string | null): ParquetRow {
  return {
    custom_id: line.custom_id,
    messages: (line.messages as Msg[]).map((m) => ({
      role: text(m.role),
      content: text(m.content),
      reasoning_content: text(m.reasoning_content),
      tool_calls: parquetCalls(m.tool_calls),
      tool_call_id: text(m.tool_call_id),
    })),
    content: line.content,
    reasoning_content: line.reasoning_content,
    finish_reason: line.finish_reason,
    usage: line.usage,
    flags: line.flags,
    variant: line.variant ?? null,
    sample_index: line.sample_index ?? null,
    split,
    metadata: line.metadata == null ? null : stringifyExact(line.metadata),
    turns: line.turns == null ? null : JSON.stringify(line.turns),
    endpoint_id: line.endpoint_id,
    latency_ms: line.latency_ms,
    attempts: line.attempts,
    model: line.model,
    tools: line.tools ? JSON.stringify(line.tools) : null,
    tool_calls: parquetCalls(line.tool_calls),
  };
}

const CALL_FEATURES = ['id', 'type', 'name', 'arguments'].map((name) => ({ name, dtype: 'string' }));

/** The columns, as the dataset card's `features` (Hugging Face `datasets` types) name them. */
export const PARQUET_FEATURES: readonly Record<string, unknown>[] = [
  { name: 'custom_id', dtype: 'string' },
  {
    name: 'messages',
    list: [
      { name: 'role', dtype: 'string' },
      { name: 'content', dtype: 'string' },
      { name: 'reasoning_content', dtype: 'string' },
      { name: 'tool_calls', list: CALL_FEATURES },
      { name: 'tool_call_id', dtype: 'string' },
    ],
  },
  { name: 'content', dtype: 'string' },
  { name: 'reasoning_content', dtype: 'string' },
  { name: 'finish_reason', dtype: 'string' },
  {
    name: 'usage',
    struct: ['prompt_tokens', 'completion_tokens', 'reasoning_tokens', 'cached_tokens'].map((name) => ({ name, dtype: 'int32' })),
  },
  { name: 'flags', sequence: 'string' },
  { name: 'variant', dtype: 'string' },
  { name: 'sample_index', dtype: 'int32' },
  { name: 'split', dtype: 'string' },
  { name: 'metadata', dtype: 'string' },
  { name: 'turns', dtype: 'string' },
  { name: 'endpoint_id', dtype: 'string' },
  { name: 'latency_ms', dtype: 'int32' },
  { name: 'attempts', dtype: 'int32' },
  { name: 'model', dtype: 'string' },
  { name: 'tools', dtype: 'string' },
  { name: 'tool_calls', list: CALL_FEATURES },
];

/**
 * A stored line parsed. SpecForge's format writes a numeric id as the literal its custom_id was
 * read from: that literal comes back as the id, not the number, which may print otherwise (`1e21`,
 * `-0`) or not be exact (past 2^53).
 */
export function parseStoredLine(format: OutputFormat, text: string): Record<string, unknown> {
  const record = JSON.parse(text) as Record<string, unknown>;
  if (format === 'conversations' && typeof record.id === 'number') record.id = objectMembers(text).get('id');
  return record;
}

/** A stored record's custom_id and answer, whichever format holds it (the sample route reads them back). */
export function answerOfRecord(
  format: OutputFormat,
  record: Record<string, unknown>,
): { custom_id: string; sample_index: number; reasoning_content: string | null; content: string | null } {
  // Lines of shards written before params.n have no sample_index (answer 0); a conversations line carries it only when > 0.
  const sampleIndex = typeof record.sample_index === 'number' ? record.sample_index : Number(record.sample_index ?? 0);
  if (format !== 'conversations') {
    return {
      custom_id: record.custom_id as string,
      sample_index: sampleIndex,
      reasoning_content: (record.reasoning_content as string | null) ?? null,
      // A completions run's line holds its answer as `text`.
      content: ((record.content ?? record.text) as string | null) ?? null,
    };
  }
  const last = (record.conversations as Msg[]).at(-1) ?? {};
  return {
    custom_id: record.id as string,
    sample_index: sampleIndex,
    reasoning_content: (last.reasoning_content as string | undefined) ?? null,
    content: (last.content as string | null) ?? null,
  };
}
