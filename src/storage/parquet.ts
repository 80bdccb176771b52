import { parquetMetadata, parquetReadObjects } from 'hyparquet';
import { ByteWriter, ParquetWriter, parquetWriteBuffer } from 'hyparquet-writer';
import type { ParquetRow } from '../domain/output-format.js';
import type { TokenRow } from '../domain/token-rows.js';

// Parquet shards through hyparquet-writer (pure JavaScript; chosen over parquet-wasm for speed,
// BENCHMARKS.md "Parquet writers"), read back through hyparquet. Pages are SNAPPY-compressed: the
// writer's own codec; zstd would need a compressor it does not ship (Node 20's zlib has none).

type Element = { name: string; type?: string; converted_type?: string; repetition_type?: string; num_children?: number };

const str = (name: string, repetition_type = 'OPTIONAL'): Element => ({ name, type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type });
const int = (name: string, repetition_type = 'OPTIONAL'): Element => ({ name, type: 'INT32', repetition_type });
const list = (name: string, element: Element[]): Element[] => [
  { name, repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  ...element,
];

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

/**
 * A writer whose bytes are taken as they are written: the buffer holds one row group at most. It has
 * no flush, so the Parquet writer's calls are synchronous (they return no promise to wait for).
 */
class TakenWriter extends ByteWriter {
  /** The bytes written since the last take (copied: the buffer is written over next). */
  take(): Buffer {
    const bytes = Buffer.from(this.getBytes());
    this.index = 0;
    return bytes;
  }
}

/**
 * One Parquet file of shard rows written a row group at a time, each group's bytes handed back as
 * soon as it is written, so that a file of any size is streamed: a run's export (services/runs/export.ts).
 */
export class ParquetRowStream {
  private readonly out = new TakenWriter();
  private readonly writer = new ParquetWriter({ writer: this.out, schema: SCHEMA as never, codec: 'SNAPPY' });

  /** Writes the rows as one row group; returns the file's bytes since the last call (its header first). */
  group(rows: readonly ParquetRow[]): Buffer {
    if (rows.length) {
      const columnData = COLUMNS.map((c) => ({ name: c.name, data: rows.map((r) => r[c.name]) }));
      void this.writer.write({ columnData, rowGroupSize: rows.length } as Parameters<ParquetWriter['write']>[0]);
    }
    return this.out.take();
  }

  /** The file's last bytes: the footer that lists the row groups. */
  finish(): Buffer {
    void this.writer.finish();
    return this.out.take();
  }
}

/** Training rows (output.tokens): the ids as list<int32>, the loss mask as list<int8>, as a trainer's Arrow reads them. */
const TOKEN_COLUMNS: { name: keyof TokenRow; schema: Element[] }[] = [
  { name: 'custom_id', schema: [str('custom_id', 'REQUIRED')] },
  { name: 'sample_index', schema: [int('sample_index', 'REQUIRED')] },
  { name: 'turn', schema: [int('turn')] },
  { name: 'step', schema: [int('step')] },
  { name: 'variant', schema: [str('variant')] },
  { name: 'split', schema: [str('split')] },
  { name: 'input_ids', schema: list('input_ids', [int('element', 'REQUIRED')]) },
  { name: 'loss_mask', schema: list('loss_mask', [{ name: 'element', type: 'INT32', converted_type: 'INT_8', repetition_type: 'REQUIRED' }]) },
  { name: 'num_trainable', schema: [int('num_trainable', 'REQUIRED')] },
  { name: 'finish_reason', schema: [str('finish_reason')] },
  { name: 'flags', schema: list('flags', [str('element')]) },
];

const TOKEN_SCHEMA: Element[] = [{ name: 'root', num_children: TOKEN_COLUMNS.length }, ...TOKEN_COLUMNS.flatMap((c) => c.schema)];

/** One shard's training rows as a Parquet file. */
export function encodeTokenParquet(rows: readonly TokenRow[]): Buffer {
  const columnData = TOKEN_COLUMNS.map((c) => ({ name: c.name, data: rows.map((r) => r[c.name]) }));
  const buf = parquetWriteBuffer({ columnData, schema: TOKEN_SCHEMA, rowGroupSize: 100_000, codec: 'SNAPPY' } as Parameters<typeof parquetWriteBuffer>[0]);
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
