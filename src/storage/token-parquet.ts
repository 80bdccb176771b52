import { ByteWriter, ParquetWriter } from 'hyparquet-writer';
import { writeColumn } from 'hyparquet-writer/src/column.js';
import { encodeNestedValues } from 'hyparquet-writer/src/dremel.js';
import { schemaPathResolver } from 'hyparquet-writer/src/schema.js';
import type { PageData } from 'hyparquet-writer/src/types.js';
import type { TokenRow } from '../domain/token-rows.js';
import { writeInputIds, writeLossMask } from './id-columns.js';
import { type Element, int, list, str } from './parquet-schema.js';

// Training rows (output.tokens) as Parquet: `input_ids` list<int32> and `loss_mask` list<int8>, as
// a trainer's Arrow reads them, written by id-columns.ts; the other columns by hyparquet-writer.

const TOKEN_COLUMNS: { name: keyof TokenRow | 'loss_mask'; schema: Element[] }[] = [
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

/** Page size the writer splits a column at (its own default). */
const PAGE_BYTES = 1 << 20;

class TokenParquetWriter extends ParquetWriter {
  /** All rows as one row group: a shard is read whole. */
  writeRows(rows: readonly TokenRow[]): void {
    const start = this.writer.offset;
    const columns = [];
    const resolve = schemaPathResolver(this.schema);
    for (const c of TOKEN_COLUMNS) {
      // Each column here has one leaf: its value, or its list's element.
      let leaf = resolve([c.name]);
      while (leaf.at(-1)!.children.length) leaf = [...leaf, leaf.at(-1)!.children[0]!];
      const schemaPath = leaf.map((n) => n.element);
      const compress = this.compressors.SNAPPY;
      if (c.name === 'input_ids' || c.name === 'loss_mask') {
        columns.push((c.name === 'input_ids' ? writeInputIds : writeLossMask)(this.writer, rows, compress));
        continue;
      }
      const pageData = encodeNestedValues(leaf, rows.map((r) => r[c.name as keyof TokenRow]) as PageData['values']);
      const result = writeColumn({
        writer: this.writer,
        column: {
          columnName: schemaPath
            .slice(1)
            .map((s) => s.name)
            .join('.'),
          element: schemaPath.at(-1)!,
          schemaPath,
          codec: this.codec,
          compressors: this.compressors,
          stats: this.statistics,
          pageSize: PAGE_BYTES,
          columnIndex: false,
          offsetIndex: true,
        },
        pageData,
      });
      columns.push(result.chunk);
      this.pendingIndexes.push(result);
    }
    let total = 0n;
    for (const { meta_data } of columns) total += meta_data?.total_uncompressed_size ?? 0n;
    this.num_rows += BigInt(rows.length);
    this.row_groups.push({ columns, total_byte_size: total, num_rows: BigInt(rows.length), total_compressed_size: BigInt(this.writer.offset - start) });
  }
}

/** One shard's training rows as a Parquet file. */
export function encodeTokenParquet(rows: readonly TokenRow[]): Buffer {
  const writer = new ByteWriter();
  const pq = new TokenParquetWriter({ writer, schema: TOKEN_SCHEMA as ConstructorParameters<typeof ParquetWriter>[0]['schema'], codec: 'SNAPPY' });
  pq.writeRows(rows);
  // A ByteWriter finishes at once: nothing to wait for.
  void pq.finish();
  return Buffer.from(writer.getBuffer());
}
