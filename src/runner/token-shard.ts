import { createHash } from 'node:crypto';
import type { RunRow, ShardRow } from '../db/schema.js';
import { lineKey } from '../domain/output-line.js';
import { type OutputFormat, tokensObjectKey } from '../domain/output-format.js';
import { type ShardTrainable, type StagedIds, type TokenRow, tokenRow } from '../domain/token-rows.js';
import { encodeTokenParquet, parquetRowCount, readParquetRows } from '../storage/parquet.js';
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
  return (staged ?? []).map((g) =>
    tokenRow(
      { customId: s.customId, sampleIndex: s.sampleIndex, turn: g.turn, step: g.step, variant, split, finishReason: g.finish_reason, flags: g.flags },
      g,
    ),
  );
}

/** The rows an earlier write of this shard holds, by sample (lineKey): the only copy once its staging was dropped. */
export async function previousTokenRows(store: Store, shard: ShardRow): Promise<Map<string, TokenRow[]>> {
  const map = new Map<string, TokenRow[]>();
  if (!shard.tokensKey) return map;
  const bytes = await store.get(shard.tokensKey);
  if (createHash('sha256').update(bytes).digest('hex') !== shard.tokensSha256) throw new Error(`${shard.tokensKey} no longer holds the rows written before`);
  const rows = shard.tokensKey.endsWith('.parquet')
    ? ((await readParquetRows(bytes)) as unknown as TokenRow[]).map((r) => ({
        ...r,
        sample_index: Number(r.sample_index),
        input_ids: [...r.input_ids],
        loss_mask: [...r.loss_mask],
      }))
    : bytes
        .toString('utf8')
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as TokenRow);
  for (const r of rows) {
    const key = lineKey(r.custom_id, r.sample_index);
    const list = map.get(key);
    if (list) list.push(r);
    else map.set(key, [r]);
  }
  return map;
}

/**
 * A row as a JSON line, the same text JSON.stringify gives, written by hand for its two long lists:
 * ids joined, and the mask (zeros then ones, by construction) as repeated text, several times faster.
 */
export function tokenRowLine(r: TokenRow): string {
  const head = JSON.stringify({ custom_id: r.custom_id, sample_index: r.sample_index, turn: r.turn, step: r.step, variant: r.variant, split: r.split });
  const prompt = r.input_ids.length - r.num_trainable;
  const mask = ('0,'.repeat(prompt) + '1,'.repeat(r.num_trainable)).slice(0, -1);
  const tail = JSON.stringify({ num_trainable: r.num_trainable, finish_reason: r.finish_reason, flags: r.flags });
  return `${head.slice(0, -1)},"input_ids":[${r.input_ids.join(',')}],"loss_mask":[${mask}],${tail.slice(1)}`;
}

/** The tokens file's body in the run's format family (Parquet for parquet, JSONL otherwise), and its read-back check. */
export function encodeTokens(format: OutputFormat, rows: readonly TokenRow[], key: string): { body: Buffer; check?: (back: Buffer) => void } {
  if (format !== 'parquet') return { body: Buffer.from(rows.map(tokenRowLine).join('\n') + '\n') };
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
