import { join } from 'node:path';
import { closeDb, openDb, sqliteClient } from '../src/db/client.js';
import { applyOutcomes, type Outcome } from '../src/db/results.js';
import { insertRunVariants, listRunVariants } from '../src/db/run-variants.js';
import { insertRun } from '../src/db/runs.js';
import { variantIndex } from '../src/domain/variants.js';
import { tempDir } from '../test/support/server.js';
import { scaled, type Figure } from './support.js';

// What a run's variants cost the result writer: the same completions committed for a run without
// variants and for one with four, side by side (each half of each in turn), on one SQLite file; and
// why the counters are kept as they go: their read against a GROUP BY over the run's samples.

const VARIANTS = ['a', 'b', 'c', 'd'].map((name, i) => ({ name, weight: i + 1 }));
const BATCH = 500;
const OWNER = 'bench';

export async function benchVariants(): Promise<Figure[]> {
  const n = scaled(200_000, 2000);
  const tmp = tempDir('regen-bench-variants-');
  const db = await openDb(join(tmp.dir, 'regen.db'));
  try {
    const sqlite = sqliteClient(db);
    const runs = { plain: 'run_plain', mixed: 'run_mixed' };
    for (const [kind, id] of Object.entries(runs)) {
      await insertRun(db, {
        id,
        model: 'm',
        status: 'in_progress',
        createdAt: 0,
        params: {},
        input: { file_id: 'f' },
        shardSize: 1000,
        outputUri: `file:///tmp/${id}/`,
        metadata: {},
        onInvalidLine: 'fail',
        requestTimeoutMs: 60_000,
        maxAttempts: 3,
        updatedAt: 0,
        variants: kind === 'mixed' ? VARIANTS : null,
        total: n,
        inProgress: n,
      });
      const insert = sqlite.prepare(
        `insert into samples (run_id, seq, shard_idx, custom_id, status, request, lease_owner, variant) values (?, ?, ?, ?, 'in_progress', '{"messages":[]}', ?, ?)`,
      );
      const totals = VARIANTS.map(() => 0);
      sqlite.transaction(() => {
        for (let i = 0; i < n; i++) {
          const variant = kind === 'mixed' ? variantIndex(`s${i}`, VARIANTS) : null;
          if (variant !== null) totals[variant]!++;
          insert.run(id, i, Math.floor(i / 1000), `s${i}`, OWNER, variant);
        }
      })();
      await sqlite.exec(
        `insert into shards (run_id, idx, first_seq, sample_count) select '${id}', idx, idx * 1000, 1000 from (select distinct shard_idx as idx from samples where run_id = '${id}')`,
      );
      if (kind === 'mixed') await db.tx((tx) => insertRunVariants(tx, id, totals));
    }
    const ids = new Map<string, number[]>();
    for (const id of Object.values(runs))
      ids.set(id, (sqlite.prepare('select id from samples where run_id = ? order by seq').pluck().all(id) as number[]).slice());
    // Each sample's variant as the runner has it from its claim: read, not hashed again in the timed loop.
    const variantOf = sqlite.prepare(`select variant from samples where run_id = '${runs.mixed}' order by seq`).pluck().all() as number[];
    const outcome = (runId: string, sampleId: number, seq: number, variant: number | null): Outcome => ({
      kind: 'completed',
      sampleId,
      runId,
      shardIdx: Math.floor(seq / 1000),
      endpointId: 'e1',
      variant,
      usage: { prompt_tokens: 40, completion_tokens: 300, reasoning_tokens: 200, cached_tokens: 0 },
      finishReason: 'stop',
      latencyMs: 100,
      flags: seq % 50 === 0 ? 4 : 0,
      chars: { reasoning: 800, content: 400 },
      output: '{"content":"x","reasoning_content":"y","model":"m"}',
      at: 1,
    });
    const seconds = { plain: 0, mixed: 0 };
    // Halves in turn, so a load that comes and goes on the shared machine falls on both.
    for (const half of [0, 1]) {
      for (const kind of ['plain', 'mixed'] as const) {
        const runId = runs[kind];
        const all = ids.get(runId)!;
        const from = half * Math.floor(n / 2);
        const to = half ? n : Math.floor(n / 2);
        const t0 = performance.now();
        for (let i = from; i < to; i += BATCH) {
          const batch: Outcome[] = [];
          for (let j = i; j < Math.min(to, i + BATCH); j++) batch.push(outcome(runId, all[j]!, j, kind === 'mixed' ? variantOf[j]! : null));
          await db.tx((tx) => applyOutcomes(tx, OWNER, batch, 1));
        }
        seconds[kind] += (performance.now() - t0) / 1000;
      }
    }
    const counted = (await listRunVariants(db, runs.mixed)).reduce((t, v) => t + v.completed, 0);
    if (counted !== n) throw new Error(`the variants counted ${counted} completions of ${n}`);

    // The run object's read: the counters, against a GROUP BY of the samples by variant and status.
    const reads = 20;
    let t0 = performance.now();
    for (let i = 0; i < reads; i++) await listRunVariants(db, runs.mixed);
    const countersMs = (performance.now() - t0) / reads;
    t0 = performance.now();
    for (let i = 0; i < reads; i++) await db.exec('select variant, status, count(*) as n from samples where run_id = ? group by variant, status', [runs.mixed]);
    const groupByMs = (performance.now() - t0) / reads;

    const plainRate = n / seconds.plain;
    const mixedRate = n / seconds.mixed;
    return [
      {
        part: 'variants',
        figure: `result writer, ${n.toLocaleString('en')} completions: 4 variants (baseline: none)`,
        regen: mixedRate,
        baseline: plainRate,
        unit: 'samples/s',
        ratio: mixedRate / plainRate,
        target: '≥ 0.9',
        ok: mixedRate / plainRate >= 0.9,
      },
      {
        part: 'variants',
        figure: `per-variant counts of ${n.toLocaleString('en')} samples: counters (baseline: GROUP BY over the samples)`,
        regen: countersMs,
        baseline: groupByMs,
        unit: 'ms',
        ratio: groupByMs / countersMs,
        target: '≥ 10',
        ok: groupByMs / countersMs >= 10,
      },
    ];
  } finally {
    await closeDb(db);
    tmp.cleanup();
  }
}
