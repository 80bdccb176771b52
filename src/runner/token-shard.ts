import { createHash } from 'node:crypto';
import type { RunRow, ShardRow } from '../db/schema.js';
import { lineKey } from '../domain/output-line.js';
import { type OutputFormat, tokensObjectKey } from '../domain/output-format.js';
import { idCount, joinIds, type ShardTrainable, type StagedIds, stagedOutput, stagedPrompt, type TokenRow, tokenRow } from '../domain/token-rows.js';
import { parquetRowCount, readParquetRows } from '../storage/parquet.js';
import { encodeTokenParquet } from '../storage/token-parquet.js';
import type { ObjectStore as Store } from '../storage/store.js';

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

/** The rows an earlier write of this shard holds, by sample (lineKey): the only copy once its staging was dropped. */
export async function previousTokenRows(store: Store, shard: ShardRow): Promise<Map<string, TokenRow[]>> {
  const map = new Map<string, TokenRow[]>();
  if (!shard.tokensKey) return map;
  const bytes = await store.get(shard.tokensKey);
  if (createHash('sha256').update(bytes).digest('hex') !== shard.tokensSha256) throw new Error(`${shard.tokensKey} no longer holds the rows written before`);
  // The mask is written again from the counts, as it was.
  const rows = (
    shard.tokensKey.endsWith('.parquet')
      ? await readParquetRows(bytes)
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
const ZERO = 0x30;

/** "00" to "99", two ASCII digits each: an id's digits are written two at a time, a third fewer divisions than one at a time. */
const DIGIT_PAIRS = Uint8Array.from({ length: 200 }, (_, i) => ZERO + (i & 1 ? (i >> 1) % 10 : Math.floor(i / 20)));

/** Writes `v` (0 ≤ v < 2^31) in decimal at `at`; returns where it ends. */
function writeUint(buf: Buffer, at: number, v: number): number {
  let end = at + (v < 10 ? 1 : v < 100 ? 2 : v < 1e3 ? 3 : v < 1e4 ? 4 : v < 1e5 ? 5 : v < 1e6 ? 6 : v < 1e7 ? 7 : v < 1e8 ? 8 : v < 1e9 ? 9 : 10);
  const stop = end;
  while (v >= 100) {
    const q = Math.floor(v / 100);
    const pair = (v - q * 100) << 1;
    buf[--end] = DIGIT_PAIRS[pair + 1]!;
    buf[--end] = DIGIT_PAIRS[pair]!;
    v = q;
  }
  if (v >= 10) {
    buf[--end] = DIGIT_PAIRS[(v << 1) + 1]!;
    buf[--end] = DIGIT_PAIRS[v << 1]!;
  } else buf[--end] = ZERO + v;
  return stop;
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
 * (ids digit by digit, the mask a repeated "0," then "1,"): a tenth of the time of stringifying them.
 */
export function tokenLines(rows: readonly TokenRow[]): Buffer {
  const heads = rows.map((r) =>
    JSON.stringify({ custom_id: r.custom_id, sample_index: r.sample_index, turn: r.turn, step: r.step, variant: r.variant, split: r.split }),
  );
  const tails = rows.map((r) => JSON.stringify({ num_trainable: r.num_trainable, finish_reason: r.finish_reason, flags: r.flags }));
  let size = 0;
  for (const [i, r] of rows.entries()) size += Buffer.byteLength(heads[i]!) + Buffer.byteLength(tails[i]!) + r.input_ids.length * (ID_BYTES + MASK_BYTES) + 64;
  const buf = Buffer.allocUnsafe(size);
  let at = 0;
  for (const [i, r] of rows.entries()) {
    at += buf.write(heads[i]!.slice(0, -1), at);
    at += buf.write(',"input_ids":[', at);
    const ids = r.input_ids;
    for (let k = 0; k < ids.length; k++) {
      if (k) buf[at++] = 0x2c;
      at = writeUint(buf, at, ids[k]!);
    }
    at += buf.write('],"loss_mask":[', at);
    const prompt = ids.length - r.num_trainable;
    masks(ids.length);
    at += zeros.copy(buf, at, 0, MASK_BYTES * prompt);
    at += ones.copy(buf, at, 0, MASK_BYTES * r.num_trainable);
    // The last comma gives way to the list's end.
    if (ids.length) at--;
    at += buf.write(`],${tails[i]!.slice(1)}\n`, at);
  }
  return buf.subarray(0, at);
}

/** The tokens file's body in the run's format family (Parquet for parquet, JSONL otherwise), and its read-back check. */
export function encodeTokens(format: OutputFormat, rows: readonly TokenRow[], key: string): { body: Buffer; check?: (back: Buffer) => void } {
  if (format !== 'parquet') return { body: tokenLines(rows) };
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

/**
 * Writes the shard's rows (none: an earlier file is removed) through `put`, which stores, reads
 * back and checks them, returning the digest.
 */
export async function writeTokenShard(
  run: Pick<RunRow, 'outputFormat'>,
  shard: ShardRow,
  rows: readonly TokenRow[],
  put: (key: string, body: Buffer, check?: (back: Buffer) => void) => Promise<string>,
  store: Store,
): Promise<TokensMeta> {
  if (!rows.length) {
    if (shard.tokensKey) await store.delete(shard.tokensKey);
    return NO_TOKENS;
  }
  const format = run.outputFormat as OutputFormat;
  const key = tokensObjectKey(shard, format);
  const { body, check } = encodeTokens(format, rows, key);
  const trainable: ShardTrainable = { n: rows.map((r) => r.num_trainable), v: rows.map((r) => r.variant) };
  return {
    tokensKey: key,
    tokensBytes: body.length,
    tokensRows: rows.length,
    tokensSha256: await put(key, body, check),
    tokensTrainable: JSON.stringify(trainable),
  };
}
