import { stringifyExact } from './exact-json.js';
import type { RawOutputLine, Usage } from './output-line.js';
import type { RunEndpoint } from './run-endpoint.js';

// A completions or embeddings run written as Parquet (README "Output formats"): one typed row a
// sample, the raw prompt and its text, or the input and its embedding as list<float32>, with the
// bookkeeping columns of a chat row. A prompt or input of token ids is kept as its JSON text, as a
// chat row keeps content given as parts: one column, one type.

export interface RawParquetRow {
  custom_id: string;
  sample_index: number;
  prompt?: string | null;
  text?: string | null;
  input?: string | null;
  embedding?: number[] | null;
  finish_reason: string | null;
  usage: Usage;
  flags: string[];
  variant: string | null;
  split: string | null;
  metadata: string | null;
  endpoint_id: string | null;
  latency_ms: number | null;
  attempts: number;
  model: string;
}

const asText = (v: string | number[] | undefined): string | null => (v === undefined ? null : typeof v === 'string' ? v : JSON.stringify(v));

/** An embedding as floats: a line written as OpenAI's base64 (encoding_format) holds little-endian float32s. */
function floats(embedding: number[] | string | undefined): number[] | null {
  if (embedding === undefined) return null;
  if (typeof embedding !== 'string') return embedding;
  const bytes = Buffer.from(embedding, 'base64');
  return Array.from({ length: bytes.length / 4 }, (_, i) => bytes.readFloatLE(i * 4));
}

/** The line of a completions or embeddings run as one Parquet row. */
export function rawParquetRow(line: RawOutputLine, split: string | null): RawParquetRow {
  const answer = 'input' in line ? { input: asText(line.input), embedding: floats(line.embedding) } : { prompt: asText(line.prompt), text: line.text ?? null };
  return {
    custom_id: line.custom_id,
    sample_index: line.sample_index,
    ...answer,
    finish_reason: line.finish_reason,
    usage: line.usage,
    flags: line.flags,
    variant: line.variant ?? null,
    split,
    metadata: line.metadata == null ? null : stringifyExact(line.metadata),
    endpoint_id: line.endpoint_id,
    latency_ms: line.latency_ms,
    attempts: line.attempts,
    model: line.model,
  };
}

export const isRawParquetRow = (row: object): row is RawParquetRow => 'text' in row || 'embedding' in row;

const USAGE_FEATURES = {
  name: 'usage',
  struct: ['prompt_tokens', 'completion_tokens', 'reasoning_tokens', 'cached_tokens'].map((name) => ({ name, dtype: 'int32' })),
};

/** A raw run's columns, as the dataset card's `features` (Hugging Face `datasets` types) name them. */
export function rawParquetFeatures(endpoint: Exclude<RunEndpoint, '/v1/chat/completions'>): Record<string, unknown>[] {
  const answer =
    endpoint === '/v1/embeddings'
      ? [
          { name: 'input', dtype: 'string' },
          { name: 'embedding', sequence: 'float32' },
        ]
      : [
          { name: 'prompt', dtype: 'string' },
          { name: 'text', dtype: 'string' },
        ];
  return [
    { name: 'custom_id', dtype: 'string' },
    { name: 'sample_index', dtype: 'int32' },
    ...answer,
    { name: 'finish_reason', dtype: 'string' },
    USAGE_FEATURES,
    { name: 'flags', sequence: 'string' },
    { name: 'variant', dtype: 'string' },
    { name: 'split', dtype: 'string' },
    { name: 'metadata', dtype: 'string' },
    { name: 'endpoint_id', dtype: 'string' },
    { name: 'latency_ms', dtype: 'int32' },
    { name: 'attempts', dtype: 'int32' },
    { name: 'model', dtype: 'string' },
  ];
}
