import { parquetMetadata, parquetReadObjects } from 'hyparquet';
import { ByteWriter, ParquetWriter, parquetWriteBuffer } from 'hyparquet-writer';
import type { ParquetRow } from '../domain/output-format.js';
import { isRawParquetRow, type RawParquetRow } from '../domain/raw-row.js';
import type { RunEndpoint } from '../domain/run-endpoint.js';
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

/** The columns every row of a completions or embeddings run has, after its answer's two. */
const RAW_TAIL: { name: keyof RawParquetRow; schema: Element[] }[] = [
  { name: 'finish_reason', schema: [str('finish_reason')] },
  { name: 'usage', schema: [{ name: 'usage', repetition_type: 'OPTIONAL', num_children: USAGE.length }, ...USAGE.map((u) => int(u))] },
  { name: 'flags', schema: list('flags', [str('element')]) },
  { name: 'variant', schema: [str('variant')] },
  { name: 'split', schema: [str('split')] },
  { name: 'metadata', schema: [str('metadata')] },
  { name: 'endpoint_id', schema: [str('endpoint_id')] },
  { name: 'latency_ms', schema: [int('latency_ms')] },
  { name: 'attempts', schema: [int('attempts', 'REQUIRED')] },
  { name: 'model', schema: [str('model', 'REQUIRED')] },
];

const RAW_HEAD: { name: keyof RawParquetRow; schema: Element[] }[] = [
  { name: 'custom_id', schema: [str('custom_id', 'REQUIRED')] },
  { name: 'sample_index', schema: [int('sample_index', 'REQUIRED')] },
];

/** A completions run's rows: the raw prompt and the text answered. */
const COMPLETION_COLUMNS = [...RAW_HEAD, { name: 'prompt' as const, schema: [str('prompt')] }, { name: 'text' as const, schema: [str('text')] }, ...RAW_TAIL];

/** An embeddings run's rows: the input and its vector, list<float32> as an index or a trainer's Arrow reads it. */
const EMBEDDING_COLUMNS = [
  ...RAW_HEAD,
  { name: 'input' as const, schema: [str('input')] },
  { name: 'embedding' as const, schema: list('embedding', [{ name: 'element', type: 'FLOAT', repetition_type: 'REQUIRED' }]) },
  ...RAW_TAIL,
];

type Column = { name: string; schema: Element[] };

const schemaOf = (columns: readonly Column[]): Element[] => [{ name: 'root', num_children: columns.length }, ...columns.flatMap((c) => c.schema)];

/** The columns of a run's rows, by the route its requests went to. */
function columnsOf(endpoint: RunEndpoint): readonly Column[] {
  if (endpoint === '/v1/embeddings') return EMBEDDING_COLUMNS;
  return endpoint === '/v1/completions' ? COMPLETION_COLUMNS : COLUMNS;
}

/** One shard's rows as a Parquet file: a chat run's, or a completions or embeddings run's. */
export function encodeParquet(rows: readonly ParquetRow[] | readonly RawParquetRow[]): Buffer {
  const first = rows[0];
  const columns = first === undefined || !isRawParquetRow(first) ? COLUMNS : 'embedding' in first ? EMBEDDING_COLUMNS : COMPLETION_COLUMNS;
  const columnData = columns.map((c) => ({ name: c.name, data: rows.map((r) => (r as unknown as Record<string, unknown>)[c.name]) }));
  // One row group up to 100K rows: a shard is read whole, and fewer groups write faster.
  const buf = parquetWriteBuffer({ columnData, schema: schemaOf(columns), rowGroupSize: 100_000, codec: 'SNAPPY' } as Parameters<typeof parquetWriteBuffer>[0]);
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
  private readonly columns: readonly Column[];
  private readonly writer: ParquetWriter;

  /** A file of rows of a run whose requests went to `endpoint` (chat, completions or embeddings). */
  constructor(endpoint: RunEndpoint) {
    this.columns = columnsOf(endpoint);
    this.writer = new ParquetWriter({ writer: this.out, schema: schemaOf(this.columns) as never, codec: 'SNAPPY' });
  }

  /** Writes the rows as one row group; returns the file's bytes since the last call (its header first). */
  group(rows: readonly (ParquetRow | RawParquetRow)[]): Buffer {
    if (rows.length) {
      const columnData = this.columns.map((c) => ({ name: c.name, data: rows.map((r) => (r as unknown as Record<string, unknown>)[c.name]) }));
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

const arrayBufferOf = (b: Buffer): ArrayBuffer => b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength) as ArrayBuffer;

/** The row count a Parquet file's footer declares (throws on bytes that are not Parquet). */
export function parquetRowCount(b: Buffer): number {
  return Number(parquetMetadata(arrayBufferOf(b)).num_rows);
}

/** Rows [start, end) of a Parquet file, as objects (all columns, or those named). */
export async function readParquetRows(b: Buffer, range?: { start: number; end: number }, columns?: string[]): Promise<Record<string, unknown>[]> {
  return await parquetReadObjects({ file: arrayBufferOf(b), rowStart: range?.start, rowEnd: range?.end, columns });
}
