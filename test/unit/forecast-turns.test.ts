import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { closeDb, openDb, sqliteClient, type Db } from '../../src/db/client.js';
import { turnLengthsByPosition, underwaySql } from '../../src/db/forecasts.js';
import { getRun } from '../../src/db/runs.js';
import { ForecastTurns, spreadOf } from '../../src/runner/forecast-turns.js';
import { tempDir } from '../support/server.js';

// What the forecast of a conversation run gathers on a real SQLite store: the answered turns'
// lengths by position, and the requests still ahead at each position from the conversations under
// way (from the request each is at) and from those not started (as the calibration slice's reach it),
// and the conversations themselves, for the dispatch the forecast plays forward.

const NOW = 1_700_000_000_000;
const tmp = tempDir('regen-forecast-turns-');
afterAll(() => tmp.cleanup());

/** A conversation of `users` user turns (each one request). */
const conversation = (users: number) =>
  JSON.stringify({
    messages: Array.from({ length: users }, (_, i) => [
      { role: 'user', content: `q${i}` },
      { role: 'assistant', content: `a${i}` },
    ]).flat(),
  });

interface Seeded {
  status: 'pending' | 'in_progress' | 'completed';
  turn: number;
  users: number;
  calibration?: boolean;
}

async function seed(db: Db, samples: Seeded[], turns: { sample: number; idx: number; tokens: number }[]): Promise<void> {
  const exec = (text: string, params: unknown[]) => db.write((w) => w.exec(text, params));
  const completed = samples.filter((s) => s.status === 'completed').length;
  await exec(
    `insert into runs (id, model, status, created_at, started_at, params, input, shard_size, output_uri, metadata, on_invalid_line, request_timeout_ms, max_attempts, updated_at, total, pending, completed, shards_total, turns_max)
     values ('run_t', 'm', 'in_progress', ?, ?, '{}', '{"requests":1}', 100, 'file:///tmp/x/', '{}', 'fail', 1000, 5, ?, ?, ?, ?, 1, ?)`,
    [NOW, NOW, NOW, samples.length, samples.length - completed, completed, Math.max(...samples.map((s) => s.users))],
  );
  await exec(`insert into shards (run_id, idx, first_seq, sample_count) values ('run_t', 0, 0, ?)`, [samples.length]);
  for (const [seq, s] of samples.entries()) {
    await exec(`insert into samples (id, run_id, seq, shard_idx, custom_id, request, status, turn, calibration) values (?, 'run_t', ?, 0, ?, ?, ?, ?, ?)`, [
      seq + 1,
      seq,
      `c${seq}`,
      conversation(s.users),
      s.status,
      s.turn,
      s.calibration ? 1 : 0,
    ]);
  }
  for (const t of turns) {
    await exec(
      `insert into sample_turns (sample_id, idx, run_id, prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens, latency_ms, attempts)
       values (?, ?, 'run_t', 10, ?, 0, 0, 100, 1)`,
      [t.sample, t.idx, t.tokens],
    );
  }
}

describe('the turns a conversation forecast reads', () => {
  it('counts the requests ahead by position from the conversations under way and the slice, and the conversations ahead', async () => {
    const db = await openDb(join(tmp.dir, 'ahead.db'));
    try {
      await seed(
        db,
        [
          { status: 'completed', turn: 1, users: 2 },
          { status: 'in_progress', turn: 1, users: 4 }, // at its second request: positions 1, 2, 3 ahead
          { status: 'pending', turn: 2, users: 3 }, // between turns, at its third: position 2 ahead
          { status: 'pending', turn: 0, users: 1, calibration: true },
          { status: 'pending', turn: 0, users: 4, calibration: true },
          { status: 'pending', turn: 0, users: 2 },
        ],
        [
          { sample: 1, idx: 0, tokens: 100 },
          { sample: 1, idx: 1, tokens: 300 },
          { sample: 2, idx: 0, tokens: 100 },
          { sample: 3, idx: 0, tokens: 100 },
          { sample: 3, idx: 1, tokens: 300 },
        ],
      );
      const run = (await getRun(db, 'run_t'))!;
      const read = await new ForecastTurns(db).read(run, NOW + 1000);
      // Position 0: 100 three times; position 1: 300 twice.
      const lengths = [
        { n: 3, tokens: 300, squares: 30_000 },
        { n: 2, tokens: 600, squares: 180_000 },
      ];
      expect(read.positions.lengths).toEqual(lengths);
      // Under way: [0, 1, 2, 1]. Not started: 6 − 1 completed − 2 under way = 3, reaching each
      // position as the slice's two conversations (1 and 4 requests) do: 3 × [2, 1, 1, 1] / 2.
      expect(read.positions.ahead).toEqual([3, 2.5, 3.5, 2.5]);
      expect(read.conversations).toEqual({
        underway: [
          { next: 1, requests: 4 },
          { next: 2, requests: 3 },
        ],
        unstarted: 3,
        requestCounts: [1, 4],
      });
      // Every answer is its position's mean: no spread within a position, though the positions differ.
      expect(read.spread).toBe(0);
    } finally {
      await closeDb(db);
    }
  });

  it('measures the spread of the lengths within each position, over the mean of all', () => {
    // Position 0: 50 and 150 (deviations of 50); position 1: 300 twice. Mean of all 200.
    const spread = spreadOf([
      { n: 2, tokens: 200, squares: 50 * 50 + 150 * 150 },
      { n: 2, tokens: 600, squares: 2 * 300 * 300 },
    ]);
    expect(spread).toBeCloseTo(Math.sqrt((2 * 50 * 50) / 4) / 200, 9);
    expect(spreadOf([{ n: 1, tokens: 100, squares: 10_000 }])).toBe(0);
  });

  it('reads the lengths over a bounded number of turns, and finds the conversations between turns by their own index', async () => {
    const db = await openDb(join(tmp.dir, 'bounded.db'));
    try {
      await seed(
        db,
        [{ status: 'in_progress', turn: 3, users: 4 }],
        [0, 1, 2].map((idx) => ({ sample: 1, idx, tokens: 50 })),
      );
      const bounded = await turnLengthsByPosition(db, 'run_t', 2);
      expect(bounded.reduce((n, p) => n + p.n, 0)).toBe(2);
      expect((await turnLengthsByPosition(db, 'run_t', 10)).reduce((n, p) => n + p.n, 0)).toBe(3);
      const plan = (
        sqliteClient(db)
          .prepare(`explain query plan ${underwaySql('sqlite')}`)
          .all('run_t', 'run_t') as { detail: string }[]
      ).map((r) => r.detail);
      expect(plan.join('; ')).toMatch(/samples_underway_idx/);
    } finally {
      await closeDb(db);
    }
  });
});
