import { objectMembers } from '../../domain/exact-json.js';
import { type LineFields, type OutputFormat, type ParquetRow, parquetRow } from '../../domain/output-format.js';
import { isRawLine, type RawOutputLine } from '../../domain/output-line.js';
import { type RawParquetRow, rawParquetRow } from '../../domain/raw-row.js';
import type { RunEndpoint } from '../../domain/run-endpoint.js';
import { ParquetRowStream, readParquetRows } from '../../storage/parquet.js';

// How an export writes the shards it reads (README "Exporting a run as one file"): lines of a JSONL shard as
// they were written, a Parquet shard's rows as JSON lines, or either as rows of one Parquet file.

export const EXPORT_FORMATS = ['jsonl', 'parquet'] as const;
export type ExportFormat = (typeof EXPORT_FORMATS)[number];

/** The export format a run's shards are in: conversations are JSONL lines too. */
export const ownExportFormat = (format: OutputFormat): ExportFormat => (format === 'parquet' ? 'parquet' : 'jsonl');

/**
 * Rows gathered into one row group before it is written: the default shard size, so an export holds
 * about one shard's rows in memory whatever the run's shards hold after a variant filter.
 */
const ROW_GROUP_ROWS = 1000;

/** Turns verified shards, one at a time, into the export's bytes. */
export interface ExportWriter {
  /** The bytes a shard adds (possibly none yet: rows wait for a full row group). */
  shard(bytes: Buffer, split: string | null): Promise<Buffer>;
  /** The bytes that end the file. */
  end(): Buffer;
}

const EMPTY = Buffer.alloc(0);

const lines = (bytes: Buffer): string[] => bytes.toString('utf8').split('\n').filter(Boolean);

/** Whether a record belongs to the variant asked for (every record does when none is). */
const ofVariant = (variant: string | null, record: { variant?: unknown }): boolean => variant === null || record.variant === variant;

/**
 * A JSONL shard's line as a Parquet row, as a Parquet run writes it (shard-writer.ts recordOf): the
 * input's own fields keep the text they were written with, numbers parsing would change included.
 */
function rowOfLine(text: string, split: string | null): ParquetRow | RawParquetRow {
  const line = JSON.parse(text) as LineFields | RawOutputLine;
  const row = isRawLine(line as RawOutputLine) ? rawParquetRow(line as RawOutputLine, split) : parquetRow(line as LineFields, split);
  if (line.metadata != null) row.metadata = objectMembers(text).get('metadata') ?? row.metadata;
  return row;
}

/** The writer for an export from shards in `source` format to `target`, keeping only `variant`'s records when one is named. */
export function exportWriter(source: OutputFormat, target: ExportFormat, variant: string | null, endpoint: RunEndpoint): ExportWriter {
  if (target === 'jsonl') {
    return {
      async shard(bytes) {
        if (source !== 'parquet') {
          if (variant === null) return bytes;
          const kept = lines(bytes).filter((l) => ofVariant(variant, JSON.parse(l) as { variant?: unknown }));
          return kept.length ? Buffer.from(kept.join('\n') + '\n') : EMPTY;
        }
        const rows = (await readParquetRows(bytes)).filter((r) => ofVariant(variant, r));
        return rows.length ? Buffer.from(rows.map((r) => JSON.stringify(r)).join('\n') + '\n') : EMPTY;
      },
      end: () => EMPTY,
    };
  }
  const file = new ParquetRowStream(endpoint);
  let pending: (ParquetRow | RawParquetRow)[] = [];
  return {
    async shard(bytes, split) {
      const rows =
        source === 'parquet'
          ? ((await readParquetRows(bytes)) as unknown as (ParquetRow | RawParquetRow)[]).filter((r) => ofVariant(variant, r))
          : lines(bytes)
              .map((l) => rowOfLine(l, split))
              .filter((r) => ofVariant(variant, r));
      // One at a time: spreading a shard of 100,000 rows into push's arguments can pass the stack's limit.
      for (const row of rows) pending.push(row);
      if (pending.length < ROW_GROUP_ROWS) return EMPTY;
      const group = pending;
      pending = [];
      return file.group(group);
    },
    end() {
      return Buffer.concat([file.group(pending), file.finish()]);
    },
  };
}
