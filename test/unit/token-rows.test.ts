import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { describe, expect, it } from 'vitest';
import {
  conversationIds,
  idCount,
  joinIds,
  packIds,
  spreadOf,
  stagedIds,
  stagedOutput,
  stagedPrompt,
  type TokenRow,
  tokenRow,
  trainableSpread,
} from '../../src/domain/token-rows.js';
import { tokenLines } from '../../src/runner/token-shard.js';
import { readParquetRows } from '../../src/storage/parquet.js';
import { encodeTokenParquet } from '../../src/storage/token-parquet.js';
import { readIds } from '../../src/runner/token-ids.js';

const usage = (prompt: number, completion: number) => ({ prompt_tokens: prompt, completion_tokens: completion, reasoning_tokens: 0, cached_tokens: 0 });
/** A row of a generation's ids as the server returned them. */
const rowOf = (at: Parameters<typeof tokenRow>[0], ids: { prompt: number[]; output: number[] }) =>
  tokenRow(at, [...ids.prompt, ...ids.output], ids.output.length);
const place = { customId: 'a"\u2028', sampleIndex: 1, turn: 2, step: 0, variant: 'think', split: 'eval', finishReason: 'stop', flags: 5 };

/** What a row's file holds: its ids, and the mask of zeros then ones. */
const plain = (r: TokenRow) => {
  const ids = [...r.input_ids];
  const { num_trainable, finish_reason, flags, ...head } = r;
  const loss_mask = ids.map((_, i) => (i < ids.length - num_trainable ? 0 : 1));
  return { ...head, input_ids: ids, loss_mask, num_trainable, finish_reason, flags };
};

describe('training rows', () => {
  it('masks the prompt 0 and the generated ids 1, in the JSON line JSON.stringify writes and in Parquet as written', async () => {
    const row = rowOf(place, { prompt: [7, 8, 9], output: [4, 5] });
    expect({ ...row, input_ids: [...row.input_ids] }).toMatchObject({ input_ids: [7, 8, 9, 4, 5], num_trainable: 2, flags: ['empty_content', 'truncated'] });
    const rows = [
      row,
      ...[
        { prompt: [1], output: [] },
        { prompt: [], output: [2] },
        { prompt: [], output: [] },
        { prompt: [3, 4], output: [5, 6, 7] },
        { prompt: [0, 9, 10, 99, 100, 2 ** 31 - 1], output: [151_642] },
      ].map((ids) => rowOf({ ...place, variant: null, split: null, turn: null, step: null, finishReason: null }, ids)),
    ];
    expect(tokenLines(rows).toString()).toBe(rows.map((r) => JSON.stringify(plain(r)) + '\n').join(''));
    expect(await readParquetRows(encodeTokenParquet(rows))).toEqual(rows.map(plain));
  });

  it('writes the text JSON.stringify writes for random rows: ids of every length of digits, empty generations, long rows', () => {
    // A seeded generator, so that a failure comes back the same.
    let state = 36;
    const random = () => {
      state = (Math.imul(state, 1103515245) + 12345) >>> 0;
      return state / 2 ** 32;
    };
    const below = (n: number) => Math.floor(random() * n);
    // Each id as likely to have 1 digit as 10: the boundaries of every group of four digits are crossed.
    const id = () => {
      const digits = 1 + below(10);
      const edge = [0, 9, 10, 99, 100, 999, 1000, 9999, 10_000, 99_999_999, 100_000_000, 2 ** 31 - 1][below(12)]!;
      return below(4) === 0 ? edge : Math.min(2 ** 31 - 1, below(10 ** digits));
    };
    const ids = (n: number) => Array.from({ length: n }, id);
    const lengths = [0, 1, 2, 3, 5, 80, 600, 5000];
    const rows: TokenRow[] = [];
    for (let i = 0; i < 300; i++) {
      const generation = { prompt: ids(lengths[below(lengths.length)]!), output: ids(lengths[below(lengths.length)]!) };
      const at = {
        customId: below(2) ? `s${i}` : `é"\\\u2028${i}`,
        sampleIndex: below(4),
        turn: below(2) ? null : below(9),
        step: below(2) ? null : below(3),
        variant: below(2) ? null : 'thinking',
        split: [null, 'train', 'eval'][below(3)]!,
        finishReason: [null, 'stop', 'length'][below(3)]!,
        flags: below(64),
      };
      const row = rowOf(at, generation);
      // A row as staged (an Int32Array of the joined ids) or as read back from an earlier file (an array).
      rows.push(below(2) ? { ...row, input_ids: [...row.input_ids] } : row);
    }
    // No ids at all, and a row of nothing but the largest id.
    rows.push(rowOf(place, { prompt: [], output: [] }), rowOf(place, { prompt: [2 ** 31 - 1], output: [2 ** 31 - 1, 0] }));
    const text = tokenLines(rows).toString();
    expect(text).toBe(rows.map((r) => JSON.stringify(plain(r)) + '\n').join(''));
    // One row at a time writes the same.
    expect(rows.map((r) => tokenLines([r]).toString()).join('')).toBe(text);
    expect(tokenLines([]).length).toBe(0);
  });

  it('writes a shard of ids longer than a page in pages of whole rows, read back alike by hyparquet and DuckDB', async () => {
    // 2.9 MB of ids: rows sharing pages, an empty row, and a row longer than a page alone in its own.
    // DuckDB sums an empty list to null.
    const lengths = [100_000, 200_000, 0, 300_000, 5, 120_000];
    const rows = lengths.map((n, i) => {
      const ids = Array.from({ length: n }, (_, k) => (k * 7919 + i) % 151_643);
      return rowOf({ ...place, customId: `r${i}` }, { prompt: ids.slice(0, n >> 2), output: ids.slice(n >> 2) });
    });
    const body = encodeTokenParquet(rows);
    const back = await readParquetRows(body);
    expect(back.map((r) => [r.custom_id, [...(r.input_ids as number[])], (r.loss_mask as number[]).reduce((a, b) => a + b, 0)])).toEqual(
      rows.map((r) => [r.custom_id, [...r.input_ids], r.num_trainable]),
    );
    const dir = mkdtempSync(join(tmpdir(), 'regen-token-pages-'));
    try {
      writeFileSync(join(dir, 'tokens.parquet'), body);
      const duck = await (await DuckDBInstance.create(':memory:')).connect();
      const read = await duck.runAndReadAll(
        `select custom_id, len(input_ids)::int as n, list_sum(input_ids)::bigint as sum, list_sum(loss_mask)::int as trainable from read_parquet('${join(dir, 'tokens.parquet')}') order by custom_id`,
      );
      expect(read.getRowObjectsJson()).toEqual(
        rows.map((r) => ({
          custom_id: r.custom_id,
          n: r.input_ids.length,
          sum: r.input_ids.length ? String([...r.input_ids].reduce((a, b) => a + b, 0)) : null,
          trainable: r.num_trainable || null,
        })),
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('stages ids packed and reads both the packed and the older array form', () => {
    const ids = [0, 1, 151_642, 2 ** 31 - 1];
    expect([...joinIds(packIds(ids))]).toEqual(ids);
    expect([...joinIds(ids)]).toEqual(ids);
    expect([...joinIds(packIds([]))]).toEqual([]);
    // Packed and array lists joined in order, as a row's prompt then generated ids.
    expect([...joinIds(packIds([5, 6]), [7], packIds([]), packIds([2 ** 31 - 1]))]).toEqual([5, 6, 7, 2 ** 31 - 1]);
    // Lists longer than any packed before, then shorter: each packs its own ids and nothing of the last.
    const long = Array.from({ length: 5000 }, (_, i) => i * 429_497);
    expect([...joinIds(packIds(long))]).toEqual(long);
    expect([...joinIds(packIds([3]))]).toEqual([3]);
    expect(packIds([3])).toBe(Buffer.from(Int32Array.of(3).buffer).toString('base64'));
    // Packed text that is not whole int32 values is refused, never written as ids.
    expect(() => joinIds(packIds([1]).slice(0, -4))).toThrow(/whole int32/);
    // Packed under names of their own: a replica that staged arrays finds no `prompt` or `output` in them.
    const staged = { turn: null, step: null, finish_reason: 'stop', flags: 0, ...stagedIds({ prompt: [1, 2], output: [3] }) };
    expect(staged).not.toHaveProperty('prompt');
    expect(staged).not.toHaveProperty('output');
    expect([...joinIds(stagedPrompt(staged))]).toEqual([1, 2]);
    expect(idCount(stagedOutput(staged))).toBe(1);
    const older = { turn: null, step: null, finish_reason: 'stop', flags: 0, prompt: [1, 2], output: [3, 4] };
    expect([...joinIds(stagedPrompt(older))]).toEqual([1, 2]);
    expect(idCount(stagedOutput(older))).toBe(2);
  });

  it("keeps a conversation turn's ids packed as stored, and packs those of turns stored before as arrays", () => {
    const turn = (step: number, ids: Parameters<typeof conversationIds>[0][number]['ids'], toolCalls: unknown[] | null = null) => ({
      step,
      toolCalls,
      finishReason: toolCalls ? 'tool_calls' : 'stop',
      flags: 0,
      ids,
    });
    const first = stagedIds({ prompt: [1, 2, 3], output: [4, 5] });
    // As sample_turns.token_ids holds it: the packed lists under their own names, no arrays.
    const stored = JSON.parse(JSON.stringify(first)) as typeof first;
    expect(Object.keys(stored).sort()).toEqual(['output_packed', 'prompt_packed']);
    const staged = conversationIds([
      turn(0, stored, [{ id: 'c1' }]),
      // A turn stored before the ids were packed: its arrays.
      turn(1, { prompt: [1, 2, 3, 4, 5, 6], output: [7] }),
      // A request whose run asked no ids.
      turn(0, null),
      turn(0, stagedIds({ prompt: [9], output: [] })),
    ]);
    expect(staged?.map((g) => [g.turn, g.step, [...joinIds(stagedPrompt(g))], [...joinIds(stagedOutput(g))]])).toEqual([
      [0, 0, [1, 2, 3], [4, 5]],
      [0, 1, [1, 2, 3, 4, 5, 6], [7]],
      [2, 0, [9], []],
    ]);
    // Stored packed lists are staged as they are, not decoded and packed again (these are not base64 at all).
    expect(conversationIds([turn(0, { prompt_packed: 'P', output_packed: 'O' })])).toEqual([
      { turn: 0, step: 0, finish_reason: 'stop', flags: 0, prompt_packed: 'P', output_packed: 'O' },
    ]);
    for (const g of staged ?? []) {
      expect(g).not.toHaveProperty('prompt');
      expect(g).not.toHaveProperty('output');
    }
    expect(conversationIds([turn(0, null)])).toBeUndefined();
  });

  it('gives min, p5, median, p95 and max by nearest rank, overall and per variant', () => {
    expect(spreadOf([])).toBeNull();
    const values = Array.from({ length: 100 }, (_, i) => i + 1);
    expect(spreadOf(values)).toEqual({ rows: 100, min: 1, p5: 5, median: 50, p95: 95, max: 100 });
    const spread = trainableSpread([
      { num_trainable: 6, variant: 'a' },
      { num_trainable: 600, variant: 'b' },
      { num_trainable: 8, variant: null },
    ]);
    expect(spread.overall).toMatchObject({ rows: 3, min: 6, median: 8, max: 600 });
    expect(Object.keys(spread.variants)).toEqual(['a', 'b']);
  });

  it('takes ids only when their counts are the usage, wherever the server puts them', () => {
    const sglext = { choices: [{ index: 0 }, { index: 1 }], sglext: { input_ids: [1, 2, 3], output_ids: [[4], [5, 6]] } };
    expect(readIds(sglext, 'sglext', 2, usage(3, 3))).toEqual([
      { prompt: [1, 2, 3], output: [4] },
      { prompt: [1, 2, 3], output: [5, 6] },
    ]);
    expect(readIds(sglext, 'sglext', 2, usage(3, 4))).toMatch(/3 generated token ids for usage.completion_tokens 4/);
    expect(readIds(sglext, 'sglext', 2, usage(2, 3))).toMatch(/3 prompt token ids for usage.prompt_tokens 2/);
    // SGLang's per-choice prompt ids, and vLLM's at the top level.
    expect(readIds({ choices: [{ prompt_token_ids: [1], token_ids: [2] }] }, 'token_ids', 1, usage(1, 1))).toEqual([{ prompt: [1], output: [2] }]);
    expect(readIds({ prompt_token_ids: [1], choices: [{ token_ids: [2] }] }, 'token_ids', 1, usage(1, 1))).toEqual([{ prompt: [1], output: [2] }]);
    expect(readIds({ choices: [{ token_ids: [2] }] }, 'token_ids', 1, usage(0, 1))).toMatch(/without the prompt token ids/);
    expect(readIds({ prompt_token_ids: [1], choices: [{ token_ids: [2 ** 31] }] }, 'token_ids', 1, usage(1, 1))).toMatch(/outside the vocabulary/);
    expect(readIds({ prompt_token_ids: [1], choices: [{ token_ids: [1.5] }] }, 'token_ids', 1, usage(1, 1))).toMatch(/outside the vocabulary/);
  });
});
