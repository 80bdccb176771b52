import { createHash } from 'node:crypto';
import type { ShardRow } from '../db/schema.js';
import { REMOVED, storedByShard } from '../db/shards.js';
import { lineKey } from '../domain/output-line.js';
import { type OutputFormat, tokensObjectKey } from '../domain/output-format.js';
import { idCount, joinIds, type ShardTrainable, type StagedIds, stagedOutput, stagedPrompt, type TokenRow, tokenRow } from '../domain/token-rows.js';
import type { ObjectStore as Store } from '../storage/store.js';

/**
 * The Parquet reader and writer, and the training rows' Parquet encoder, loaded on first use: most
 * runs write JSONL, and the runner thread starts sooner without them (BENCHMARKS.md, 2026-12-07,
 * ninth session).
 */
export const parquetModule = () => import('../storage/parquet.js');
export const tokenParquetModule = () => import('../storage/token-parquet.js');

// A shard's training rows (output.tokens), written beside its text from the same staged outputs,
// before the shard is marked uploaded: a shard written again writes the same rows, so kill -9
// loses none and duplicates none.

/** The sample a row belongs to, as the shard reads it. */
interface RowSample {
  customId: string;
  sampleIndex: number;
  variant?: number | null;
}

/** The rows of one completed sample: one per generation its line keeps. */
export function sampleTokenRows(s: RowSample, staged: readonly StagedIds[] | undefined, variants: readonly string[] | null, split: string | null): TokenRow[] {
  const variant = variants && s.variant !== null && s.variant !== undefined ? (variants[s.variant] ?? null) : null;
  return (staged ?? []).map((g) => {
    const output = stagedOutput(g);
    return tokenRow(
      { customId: s.customId, sampleIndex: s.sampleIndex, turn: g.turn, step: g.step, variant, split, finishReason: g.finish_reason, flags: g.flags },
      joinIds(stagedPrompt(g), output),
      idCount(output),
    );
  });
}

/**
 * An earlier file of the shard at `key`, read back for the records whose staging was dropped: the
 * one recorded (`recorded`, its digest), or one an upload that did not get to mark the shard left
 * there; null where such an upload removed it. Anything else at the key is refused: only what this
 * shard wrote is trusted, not whatever now sits at its key.
 */
export async function readShardFile(store: Store, shard: Pick<ShardRow, 'pendingDigests'>, key: string, recorded: string | null): Promise<Buffer | null> {
  if (!(await store.head(key))) {
    if (storedByShard(shard, recorded, key, REMOVED)) return null;
    throw new Error(`${key} no longer holds the file this shard wrote: it is gone`);
  }
  const bytes = await store.get(key);
  if (!storedByShard(shard, recorded, key, createHash('sha256').update(bytes).digest('hex')))
    throw new Error(`${key} no longer holds the file this shard wrote`);
  return bytes;
}

/** The rows an earlier write of this shard holds, by sample (lineKey): the only copy once its staging was dropped. */
export async function previousTokenRows(store: Store, shard: ShardRow): Promise<Map<string, TokenRow[]>> {
  const map = new Map<string, TokenRow[]>();
  if (!shard.tokensKey) return map;
  const bytes = await readShardFile(store, shard, shard.tokensKey, shard.tokensSha256);
  if (!bytes) return map;
  // The mask is written again from the counts, as it was.
  const rows = (
    shard.tokensKey.endsWith('.parquet')
      ? await (await parquetModule()).readParquetRows(bytes)
      : bytes
          .toString('utf8')
          .split('\n')
          .filter((l) => l !== '')
          .map((l) => JSON.parse(l) as Record<string, unknown>)
  ).map(({ loss_mask: _, ...r }) => ({ ...r, sample_index: Number(r.sample_index) }) as TokenRow);
  for (const r of rows) {
    const key = lineKey(r.custom_id, r.sample_index);
    const list = map.get(key);
    if (list) list.push(r);
    else map.set(key, [r]);
  }
  return map;
}

/** Bytes a row's ids and mask can take: ten digits and a comma an id, a digit and a comma its mask. */
const ID_BYTES = 11;
const MASK_BYTES = 2;
const COMMA = 0x2c;
/** Ids are written in groups of four digits, each one 32-bit store of a word looked up in a table (10,000 entries). */
const GROUP = 10_000;

/** "0" to "9999": each number's ASCII digits in a 32-bit word's low bytes (first digit lowest), and how many there are. */
const DIGITS = new Uint32Array(GROUP);
const DIGIT_COUNT = new Uint8Array(GROUP);
/** "0000" to "9999": four digits each, zeros in front, as a group after the first is written. */
const FOUR_DIGITS = new Uint32Array(GROUP);
for (let v = 0; v < GROUP; v++) {
  const short = String(v);
  const four = short.padStart(4, '0');
  let digits = 0;
  let fourDigits = 0;
  for (let i = 0; i < 4; i++) {
    digits |= (i < short.length ? short.charCodeAt(i) : 0) << (8 * i);
    fourDigits |= four.charCodeAt(i) << (8 * i);
  }
  DIGITS[v] = digits;
  FOUR_DIGITS[v] = fourDigits;
  DIGIT_COUNT[v] = short.length;
}

/**
 * Writes each id (0 ≤ id < 2^31) in decimal and a comma after it, from `at`; returns where the
 * last comma ends. Each group of four digits is one unaligned little-endian store of its table
 * word: a word holding fewer digits writes zeros past them, which the next write covers (the
 * buffer has room to spare past its last id).
 */
function writeIds(out: DataView, at: number, ids: Int32Array | number[]): number {
  for (let k = 0; k < ids.length; k++) {
    const v = ids[k]!;
    if (v < GROUP) {
      out.setUint32(at, DIGITS[v]!, true);
      at += DIGIT_COUNT[v]!;
    } else if (v < GROUP * GROUP) {
      const high = Math.trunc(v / GROUP);
      out.setUint32(at, DIGITS[high]!, true);
      at += DIGIT_COUNT[high]!;
      out.setUint32(at, FOUR_DIGITS[v - high * GROUP]!, true);
      at += 4;
    } else {
      const top = Math.trunc(v / (GROUP * GROUP));
      const rest = v - top * GROUP * GROUP;
      const high = Math.trunc(rest / GROUP);
      out.setUint32(at, DIGITS[top]!, true);
      at += DIGIT_COUNT[top]!;
      out.setUint32(at, FOUR_DIGITS[high]!, true);
      out.setUint32(at + 4, FOUR_DIGITS[rest - high * GROUP]!, true);
      at += 8;
    }
    out.setUint8(at++, COMMA);
  }
  return at;
}

/** A mask's text, "0," and "1," repeated for the longest row written yet: copied from, not filled a row at a time. */
let zeros = Buffer.alloc(0);
let ones = Buffer.alloc(0);

function masks(ids: number): void {
  if (zeros.length >= MASK_BYTES * ids) return;
  zeros = Buffer.alloc(MASK_BYTES * Math.max(ids, 2 * zeros.length), '0,');
  ones = Buffer.alloc(zeros.length, '1,');
}

/**
 * The rows as JSON lines, the same text JSON.stringify writes, its two long lists written as bytes
 * (ids four digits at a time, the mask a repeated "0," then "1,"): 5 ms for 1,000 rows of 680 ids,
 * where writing the ids two digits at a time took 12.
 */
export function tokenLines(rows: readonly TokenRow[]): Buffer {
  const heads = rows.map((r) =>
    JSON.stringify({ custom_id: r.custom_id, sample_index: r.sample_index, turn: r.turn, step: r.step, variant: r.variant, split: r.split }),
  );
  const tails = rows.map((r) => JSON.stringify({ num_trainable: r.num_trainable, finish_reason: r.finish_reason, flags: r.flags }));
  let size = 0;
  for (const [i, r] of rows.entries()) size += Buffer.byteLength(heads[i]!) + Buffer.byteLength(tails[i]!) + r.input_ids.length * (ID_BYTES + MASK_BYTES) + 64;
  const buf = Buffer.allocUnsafe(size);
  const view = new DataView(buf.buffer, buf.byteOffset, buf.length);
  let at = 0;
  for (const [i, r] of rows.entries()) {
    at += buf.write(heads[i]!.slice(0, -1), at);
    at += buf.write(',"input_ids":[', at);
    const ids = r.input_ids;
    at = writeIds(view, at, ids);
    // The last comma gives way to the list's end.
    if (ids.length) at--;
    at += buf.write('],"loss_mask":[', at);
    const prompt = ids.length - r.num_trainable;
    masks(ids.length);
    at += zeros.copy(buf, at, 0, MASK_BYTES * prompt);
    at += ones.copy(buf, at, 0, MASK_BYTES * r.num_trainable);
    if (ids.length) at--;
    at += buf.write(`],${tails[i]!.slice(1)}\n`, at);
  }
  return buf.subarray(0, at);
}

/** The tokens file's body in the run's format family (Parquet for parquet, JSONL otherwise), and its read-back check. */
export async function encodeTokens(format: OutputFormat, rows: readonly TokenRow[], key: string): Promise<{ body: Buffer; check?: (back: Buffer) => void }> {
  if (format !== 'parquet') return { body: tokenLines(rows) };
  const [{ encodeTokenParquet }, { parquetRowCount }] = await Promise.all([tokenParquetModule(), parquetModule()]);
  const body = encodeTokenParquet(rows);
  const check = (back: Buffer) => {
    const count = parquetRowCount(back);
    if (count !== rows.length) throw new Error(`verification of ${key} failed: ${count} rows read back, ${rows.length} written`);
  };
  return { body, check };
}

/** What a shard row records of its tokens file; all null when the shard has no rows. */
export type TokensMeta = Pick<ShardRow, 'tokensKey' | 'tokensBytes' | 'tokensRows' | 'tokensSha256' | 'tokensTrainable'>;

export const NO_TOKENS: TokensMeta = { tokensKey: null, tokensBytes: null, tokensRows: null, tokensSha256: null, tokensTrainable: null };

/** The shard's tokens file: its key, its bytes and their read-back check, and the rows' trainable-token counts (shards.tokens_trainable). */
export async function tokenFile(
  format: OutputFormat,
  shard: Pick<ShardRow, 'idx' | 'split'>,
  rows: readonly TokenRow[],
): Promise<{ key: string; body: Buffer; check?: (back: Buffer) => void; trainable: string }> {
  const key = tokensObjectKey(shard, format);
  const trainable: ShardTrainable = { n: rows.map((r) => r.num_trainable), v: rows.map((r) => r.variant) };
  return { key, ...(await encodeTokens(format, rows, key)), trainable: JSON.stringify(trainable) };
}
