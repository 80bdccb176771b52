import { ByteWriter, type ParquetWriter } from 'hyparquet-writer';
import { writePageHeader } from 'hyparquet-writer/src/datapage.js';
import type { Writer } from 'hyparquet-writer/src/types.js';
import type { TokenRow } from '../domain/token-rows.js';

// The two long list columns of training rows, `input_ids` list<int32> and `loss_mask` list<int8>,
// written here a row at a time rather than by hyparquet-writer a value at a time (its walk of a
// list's values, their levels and their encoding took nine tenths of a tokens shard's time,
// BENCHMARKS.md "Token rows"). Every row's levels are alike: its first value at repetition 0, the
// rest at 1, all defined; an empty list is one undefined slot. So each row's levels are two RLE
// runs, the ids are their int32 bytes as they lie in memory (PLAIN, little-endian), and the mask,
// zeros over the prompt then ones, is dictionary-encoded as two runs over the dictionary [0, 1].

/** The levels of a list whose element is required: the list present and holding a value, or empty. */
const DEFINED = 2;
const EMPTY = 1;

/** One RLE run of the hybrid encoding (Parquet's "RLE/bit-packing hybrid"), of values at most one byte wide. */
function run(w: ByteWriter, count: number, value: number): void {
  w.appendVarInt(count << 1);
  w.appendUint8(value);
}

interface Page {
  levels: ByteWriter;
  repBytes: number;
  defBytes: number;
  slots: number;
  empty: number;
}

/** Each row's repetition levels, then its definition levels, as RLE runs (one bit and two bits wide, both one byte a run value). */
function listLevels(rows: readonly TokenRow[]): Page {
  const levels = new ByteWriter();
  let slots = 0;
  let empty = 0;
  for (const r of rows) {
    const n = r.input_ids.length;
    run(levels, 1, 0);
    if (n > 1) run(levels, n - 1, 1);
    slots += Math.max(1, n);
    if (!n) empty++;
  }
  const repBytes = levels.offset;
  for (const r of rows) run(levels, Math.max(1, r.input_ids.length), r.input_ids.length ? DEFINED : EMPTY);
  return { levels, repBytes, defBytes: levels.offset - repBytes, slots, empty };
}

/** A column chunk's description in the footer, as hyparquet-writer's own hyparquet types it. */
type ColumnChunk = ParquetWriter['row_groups'][number]['columns'][number];

type Compress = (b: Uint8Array) => Uint8Array;

/** A DATA_PAGE_V2 of `values` (already encoded) under the rows' levels; returns its uncompressed size. */
function dataPage(w: Writer, p: Page, rows: number, encoding: 'PLAIN' | 'RLE_DICTIONARY', values: Uint8Array, compress: Compress): number {
  const compressed = compress(values);
  const start = w.offset;
  writePageHeader(w, {
    type: 'DATA_PAGE_V2',
    uncompressed_page_size: p.levels.offset + values.length,
    compressed_page_size: p.levels.offset + compressed.length,
    data_page_header_v2: {
      num_values: p.slots,
      num_nulls: p.empty,
      num_rows: rows,
      encoding,
      definition_levels_byte_length: p.defBytes,
      repetition_levels_byte_length: p.repBytes,
      is_compressed: true,
    },
  } as Parameters<typeof writePageHeader>[1]);
  const header = w.offset - start;
  w.appendBytes(p.levels.getBytes());
  w.appendBytes(compressed);
  return header + p.levels.offset + values.length;
}

function chunk(
  name: string,
  start: number,
  w: Writer,
  slots: number,
  uncompressed: number,
  encodings: string[],
  dictionaryAt?: number,
  dataAt?: number,
): ColumnChunk {
  return {
    meta_data: {
      type: 'INT32',
      encodings,
      path_in_schema: [name, 'list', 'element'],
      codec: 'SNAPPY',
      num_values: BigInt(slots),
      total_compressed_size: BigInt(w.offset - start),
      total_uncompressed_size: BigInt(uncompressed),
      data_page_offset: BigInt(dataAt ?? start),
      ...(dictionaryAt !== undefined && { dictionary_page_offset: BigInt(dictionaryAt) }),
    },
    file_offset: BigInt(start),
  } as ColumnChunk;
}

/**
 * Bytes of ids a page holds at most (hyparquet-writer's own page size). Compressed a page at a time,
 * a shard's ids took half the time they took whole (BENCHMARKS.md "Token rows").
 */
const PAGE_BYTES = 1 << 20;

/** The rows in runs whose ids fit a page, a page starting at a row (a longer row alone in its page). */
function pages(rows: readonly TokenRow[]): TokenRow[][] {
  const out: TokenRow[][] = [];
  let page: TokenRow[] = [];
  let bytes = 0;
  for (const r of rows) {
    const size = r.input_ids.length * Int32Array.BYTES_PER_ELEMENT;
    if (page.length && bytes + size > PAGE_BYTES) {
      out.push(page);
      page = [];
      bytes = 0;
    }
    page.push(r);
    bytes += size;
  }
  if (page.length || !out.length) out.push(page);
  return out;
}

/** The `input_ids` column chunk: every row's ids, prompt then generated, as int32 values. */
export function writeInputIds(w: Writer, rows: readonly TokenRow[], compress: Compress): ColumnChunk {
  const start = w.offset;
  let size = 0;
  let slots = 0;
  for (const page of pages(rows)) {
    const p = listLevels(page);
    const ids = new Int32Array(p.slots - p.empty);
    let at = 0;
    for (const r of page) {
      ids.set(r.input_ids, at);
      at += r.input_ids.length;
    }
    size += dataPage(w, p, page.length, 'PLAIN', new Uint8Array(ids.buffer), compress);
    slots += p.slots;
  }
  return chunk('input_ids', start, w, slots, size, ['PLAIN']);
}

/** The dictionary the mask's values index: 0 and 1, PLAIN int32. */
const MASK_DICTIONARY = new Uint8Array(new Int32Array([0, 1]).buffer);
/** Bits a mask value's dictionary index takes. */
const MASK_BIT_WIDTH = 1;

/** The `loss_mask` column chunk: each row's zeros over its prompt and ones over its generated ids, as runs over [0, 1]. */
export function writeLossMask(w: Writer, rows: readonly TokenRow[], compress: Compress): ColumnChunk {
  const p = listLevels(rows);
  const start = w.offset;
  const dictionary = compress(MASK_DICTIONARY);
  writePageHeader(w, {
    type: 'DICTIONARY_PAGE',
    uncompressed_page_size: MASK_DICTIONARY.length,
    compressed_page_size: dictionary.length,
    dictionary_page_header: { num_values: 2, encoding: 'PLAIN' },
  } as Parameters<typeof writePageHeader>[1]);
  w.appendBytes(dictionary);
  const dictionarySize = w.offset - start - dictionary.length + MASK_DICTIONARY.length;
  const values = new ByteWriter();
  values.appendUint8(MASK_BIT_WIDTH);
  for (const r of rows) {
    const prompt = r.input_ids.length - r.num_trainable;
    if (prompt) run(values, prompt, 0);
    if (r.num_trainable) run(values, r.num_trainable, 1);
  }
  const dataAt = w.offset;
  const size = dataPage(w, p, rows.length, 'RLE_DICTIONARY', values.getBytes(), compress);
  return chunk('loss_mask', start, w, p.slots, dictionarySize + size, ['PLAIN', 'RLE_DICTIONARY'], start, dataAt);
}
