import { parquetMetadata, parquetReadObjects } from 'hyparquet';
import { parquetWriteBuffer } from 'hyparquet-writer';
import type { ParquetRow } from '../domain/output-format.js';
import { type Element, int, list, str } from './parquet-schema.js';

// Parquet shards through hyparquet-writer (pure JavaScript; chosen over parquet-wasm for speed,
// BENCHMARKS.md "Parquet writers"), read back through hyparquet. Pages are SNAPPY-compressed: the
// writer's own codec; zstd would need a compressor it does not ship (Node 20's zlib has none).

const USAGE = ['prompt_tokens', 'completion_tokens', 'reasoning_tokens', 'cached_tokens'] as const;

/** A list of tool calls: each a struct of its id, type, function name and arguments' JSON text. */
const calls = (name: string): Element[] =>
  list(name, [{ name: 'element', repetition_type: 'OPTIONAL', num_children: 4 }, str('id'), str('type'), str('name'), str('arguments')]);

/** Column order and schema: the standard three-level LIST for lists, as Arrow, DuckDB and `datasets` read them. */
const COLUMNS: { name: keyof ParquetRow; schema: Element[] }[] = [
  { name: 'custom_id', schema: [str('custom_id', 'REQUIRED')] },
  {
    name: 'messages',
    schema: list('messages', [
      { name: 'element', repetition_type: 'OPTIONAL', num_children: 5 },
      str('role'),
      str('content'),
      str('reasoning_content'),
      ...calls('tool_calls'),
      str('tool_call_id'),
    ]),
  },
  { name: 'content', schema: [str('content')] },
  { name: 'reasoning_content', schema: [str('reasoning_content')] },
  { name: 'finish_reason', schema: [str('finish_reason')] },
  { name: 'usage', schema: [{ name: 'usage', repetition_type: 'OPTIONAL', num_children: USAGE.length }, ...USAGE.map((u) => int(u))] },
  { name: 'flags', schema: list('flags', [str('element')]) },
  { name: 'variant', schema: [str('variant')] },
  { name: 'sample_index', schema: [int('sample_index')] },
  { name: 'split', schema: [str('split')] },
  { name: 'metadata', schema: [str('metadata')] },
  { name: 'turns', schema: [str('turns')] },
  { name: 'endpoint_id', schema: [str('endpoint_id')] },
  { name: 'latency_ms', schema: [int('latency_ms')] },
  { name: 'attempts', schema: [int('attempts', 'REQUIRED')] },
  { name: 'model', schema: [str('model', 'REQUIRED')] },
  { name: 'tools', schema: [str('tools')] },
  { name: 'tool_calls', schema: calls('tool_calls') },
];

const SCHEMA: Element[] = [{ name: 'root', num_children: COLUMNS.length }, ...COLUMNS.flatMap((c) => c.schema)];

/** One shard's rows as a Parquet file. */
export function encodeParquet(rows: readonly ParquetRow[]): Buffer {
  const columnData = COLUMNS.map((c) => ({ name: c.name, data: rows.map((r) => r[c.name]) }));
  // One row group up to 100K rows: a shard is read whole, and fewer groups write faster.
  const buf = parquetWriteBuffer({ columnData, schema: SCHEMA, rowGroupSize: 100_000, codec: 'SNAPPY' } as Parameters<typeof parquetWriteBuffer>[0]);
  return Buffer.from(buf);
}

const arrayBufferOf = (b: Buffer): ArrayBuffer => b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength) as ArrayBuffer;

/** The row count a Parquet file's footer declares (throws on bytes that are not Parquet). */
export function parquetRowCount(b: Buffer): number {
  return Number(parquetMetadata(arrayBufferOf(b)).num_rows);
}

/** Rows [start, end) of a Parquet file, as objects (all columns, or those named). */
export async function readParquetRows(b: Buffer, range?: { start: number; end: number }, columns?: string[]): Promise<Record<string, unknown>[]> {
  return await parquetReadObjects({ file: arrayBufferOf(b), rowStart: range?.start, rowEnd: range?.end, columns });
}
