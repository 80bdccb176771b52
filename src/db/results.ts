import { addCacheUsage, type CacheUsage } from './cache-usage.js';
import type { SampleError } from '../domain/sample-errors.js';
import type { Usage } from '../domain/output-line.js';
import { FLAG_COLUMNS, FLAGS, flagBit } from '../domain/flags.js';
import type { DbOrTx } from './client.js';
import { RELEASE_LEASE } from './samples.js';

// The result writer's statements: one transaction turns a batch of outcomes into sample, staging,
// run, shard and endpoint updates. Every sample update is guarded by status and lease owner, so an
// outcome for a sample that is no longer ours (already terminal, reclaimed after a restart)
// changes nothing and is counted as dropped. Kept together: they are one hot path.

interface Base {
  sampleId: number;
  runId: string;
  shardIdx: number;
  endpointId: string | null;
  /** Set when regen cut the answer because it looped: the tokens that spared (README "The quality gate"). */
  loopTokensSaved?: number;
}

/** What became of one dispatched sample; the writer turns a batch of these into one transaction. */
export type Outcome =
  | (Base & {
      kind: 'completed';
      usage: Usage;
      finishReason: string | null;
      latencyMs: number;
      flags: number;
      /** Lengths of reasoning_content and content, for the quality histograms. */
      chars: { reasoning: number; content: number };
      output: string;
      at: number;
    })
  | (Base & { kind: 'failed'; error: SampleError; at: number })
  // Back to the queue: a retry after backoff (usage is what the failed or flagged attempt cost). After
  // a server's fault the attempt is refunded and the fault counted instead.
  | (Base & { kind: 'retry'; availableAt: number; usage: Usage | null; qualityRetry: boolean; serverFault: boolean; error: SampleError | null })
  // Back to the queue without spending an attempt: shutdown, pause, a sick endpoint.
  | (Base & { kind: 'release' })
  | (Base & { kind: 'cancelled' });

export interface FlushReport {
  /** Runs whose counters moved, with the completions added. */
  runs: Map<string, { completed: number; tokens: number }>;
  /** Shards whose last sample just became terminal. */
  closedShards: { runId: string; idx: number }[];
  dropped: number;
}

interface RunDelta {
  pending: number;
  inProgress: number;
  completed: number;
  failed: number;
  cancelled: number;
  flagged: number;
  flags: number[];
  prompt: number;
  completion: number;
  reasoning: number;
  cached: number;
  dropped: number;
  loops: number;
  loopTokensSaved: number;
}

const newDelta = (): RunDelta => ({
  pending: 0,
  inProgress: 0,
  completed: 0,
  failed: 0,
  cancelled: 0,
  flagged: 0,
  flags: FLAGS.map(() => 0),
  prompt: 0,
  completion: 0,
  reasoning: 0,
  cached: 0,
  dropped: 0,
  loops: 0,
  loopTokensSaved: 0,
});

const GUARD = `where id = ? and status = 'in_progress' and lease_owner = ?`;

/** The writer's statements, the same text on both dialects. */
const SQL = {
  complete: `update samples set status = 'completed', endpoint_id = ?, finish_reason = ?, prompt_tokens = ?, completion_tokens = ?,
     reasoning_tokens = ?, cached_tokens = ?, latency_ms = ?, flags = ?, reasoning_chars = ?, content_chars = ?, completed_at = ?, error_code = null,
     error_message = null, error_status = null, lease_owner = null, lease_expires_at = null ${GUARD}`,
  stage: `insert into staging (sample_id, run_id, shard_idx, output) values (?, ?, ?, ?)
     on conflict (sample_id) do update set run_id = excluded.run_id, shard_idx = excluded.shard_idx, output = excluded.output`,
  fail: `update samples set status = 'failed', endpoint_id = ?, error_code = ?, error_message = ?, error_status = ?, completed_at = ?,
     lease_owner = null, lease_expires_at = null ${GUARD}`,
  retry: `update samples set status = 'pending', available_at = ?, quality_retries = quality_retries + ?,
     attempts = case when attempts > ? then attempts - ? else 0 end,
     server_faults = server_faults + ?, error_code = ?, error_message = ?, error_status = ?, lease_owner = null, lease_expires_at = null ${GUARD}`,
  release: `update samples set ${RELEASE_LEASE} ${GUARD}`,
  cancel: `update samples set status = 'cancelled', lease_owner = null, lease_expires_at = null ${GUARD}`,
  runCounters: `update runs set pending = pending + ?, in_progress = in_progress + ?, completed = completed + ?, failed = failed + ?,
     cancelled = cancelled + ?, flagged = flagged + ?, ${FLAG_COLUMNS.map(({ column }) => `${column} = ${column} + ?`).join(', ')}, prompt_tokens = prompt_tokens + ?,
     completion_tokens = completion_tokens + ?, reasoning_tokens = reasoning_tokens + ?, cached_tokens = cached_tokens + ?, dropped_results = dropped_results + ?,
     loops_stopped = loops_stopped + ?, loop_tokens_saved = loop_tokens_saved + ?, updated_at = ? where id = ?`,
  shardTerminal: `update shards set terminal_count = terminal_count + ? where run_id = ? and idx = ? returning terminal_count, sample_count`,
  endpointStats: `update endpoints set completed = completed + ?, failed = failed + ? where id = ?`,
};

/** Applies a batch of outcomes; call inside a transaction. */
export async function applyOutcomes(tx: DbOrTx, owner: string, batch: Outcome[], now: number): Promise<FlushReport> {
  const deltas = new Map<string, RunDelta>();
  const shardDeltas = new Map<string, { runId: string; idx: number; n: number }>();
  const endpointDeltas = new Map<string, { completed: number; failed: number }>();
  // Per run, per endpoint: the answered prompt and cached tokens (db/cache-usage.ts).
  const cacheDeltas = new Map<string, Map<string, CacheUsage>>();
  const report: FlushReport = { runs: new Map(), closedShards: [], dropped: 0 };
  // Whether each outcome changed its sample; the counters below move only for those.
  const applied =
    tx.dialect === 'pg' && new Set(batch.map((o) => o.sampleId)).size === batch.length
      ? await updateSamplesAtOnce(tx, owner, batch)
      : await updateSamplesEach(tx, owner, batch);
  for (const [i, o] of batch.entries()) {
    let d = deltas.get(o.runId);
    if (!d) deltas.set(o.runId, (d = newDelta()));
    if (!applied[i]) {
      d.dropped++;
      report.dropped++;
      continue;
    }
    const usage = o.kind === 'completed' ? o.usage : o.kind === 'retry' ? o.usage : null;
    const terminal = o.kind === 'completed' || o.kind === 'failed' || o.kind === 'cancelled';
    if (o.kind === 'completed') {
      d.completed++;
      if (o.flags) d.flagged++;
      for (const [f, flag] of FLAGS.entries()) if (o.flags & flagBit(flag)) d.flags[f]++;
    } else if (o.kind === 'failed') d.failed++;
    else if (o.kind === 'cancelled') d.cancelled++;
    else d.pending++;
    d.inProgress--;
    if (o.loopTokensSaved !== undefined) {
      d.loops++;
      d.loopTokensSaved += o.loopTokensSaved;
    }
    if (usage) {
      d.prompt += usage.prompt_tokens;
      d.completion += usage.completion_tokens;
      d.reasoning += usage.reasoning_tokens;
      d.cached += usage.cached_tokens;
    }
    if (usage && o.endpointId) {
      let byEndpoint = cacheDeltas.get(o.runId);
      if (!byEndpoint) cacheDeltas.set(o.runId, (byEndpoint = new Map()));
      const c = byEndpoint.get(o.endpointId) ?? { endpointId: o.endpointId, promptTokens: 0, cachedTokens: 0 };
      c.promptTokens += usage.prompt_tokens;
      c.cachedTokens += usage.cached_tokens;
      byEndpoint.set(o.endpointId, c);
    }
    if (o.endpointId && (o.kind === 'completed' || o.kind === 'failed')) {
      const e = endpointDeltas.get(o.endpointId) ?? { completed: 0, failed: 0 };
      e[o.kind]++;
      endpointDeltas.set(o.endpointId, e);
    }
    if (terminal) {
      const key = `${o.runId}\0${o.shardIdx}`;
      const sd = shardDeltas.get(key) ?? { runId: o.runId, idx: o.shardIdx, n: 0 };
      sd.n++;
      shardDeltas.set(key, sd);
    }
    if (o.kind === 'completed') {
      const r = report.runs.get(o.runId) ?? { completed: 0, tokens: 0 };
      r.completed++;
      r.tokens += o.usage.completion_tokens;
      report.runs.set(o.runId, r);
    }
  }
  for (const [runId, d] of deltas) {
    await tx.exec(SQL.runCounters, [
      d.pending,
      d.inProgress,
      d.completed,
      d.failed,
      d.cancelled,
      d.flagged,
      ...d.flags,
      d.prompt,
      d.completion,
      d.reasoning,
      d.cached,
      d.dropped,
      d.loops,
      d.loopTokensSaved,
      now,
      runId,
    ]);
    if (!report.runs.has(runId)) report.runs.set(runId, { completed: 0, tokens: 0 });
  }
  for (const sd of shardDeltas.values()) {
    const [row] = (await tx.exec<{ terminal_count: number; sample_count: number }>(SQL.shardTerminal, [sd.n, sd.runId, sd.idx])).rows;
    if (row && row.terminal_count === row.sample_count) report.closedShards.push({ runId: sd.runId, idx: sd.idx });
  }
  for (const [id, e] of endpointDeltas) await tx.exec(SQL.endpointStats, [e.completed, e.failed, id]);
  for (const [runId, byEndpoint] of cacheDeltas) await addCacheUsage(tx, runId, [...byEndpoint.values()]);
  return report;
}

/**
 * The sample updates one statement each, in the batch's order: SQLite's way (a statement costs no
 * round trip there), and PostgreSQL's for a batch naming a sample twice, where the second outcome
 * must find the first one's status. Whether each outcome changed its sample.
 */
async function updateSamplesEach(tx: DbOrTx, owner: string, batch: Outcome[]): Promise<boolean[]> {
  const applied: boolean[] = [];
  for (const o of batch) {
    let changed = 0;
    switch (o.kind) {
      case 'completed':
        ({ changes: changed } = await tx.exec(SQL.complete, [
          o.endpointId,
          o.finishReason,
          o.usage.prompt_tokens,
          o.usage.completion_tokens,
          o.usage.reasoning_tokens,
          o.usage.cached_tokens,
          o.latencyMs,
          o.flags,
          o.chars.reasoning,
          o.chars.content,
          o.at,
          o.sampleId,
          owner,
        ]));
        if (changed) await tx.exec(SQL.stage, [o.sampleId, o.runId, o.shardIdx, o.output]);
        break;
      case 'failed':
        ({ changes: changed } = await tx.exec(SQL.fail, [o.endpointId, o.error.code, o.error.message, o.error.status, o.at, o.sampleId, owner]));
        break;
      case 'retry':
        ({ changes: changed } = await tx.exec(SQL.retry, [
          o.availableAt,
          o.qualityRetry ? 1 : 0,
          o.serverFault ? 1 : 0,
          o.serverFault ? 1 : 0,
          o.serverFault ? 1 : 0,
          o.error?.code ?? null,
          o.error?.message ?? null,
          o.error?.status ?? null,
          o.sampleId,
          owner,
        ]));
        break;
      case 'release':
        ({ changes: changed } = await tx.exec(SQL.release, [o.sampleId, owner]));
        break;
      case 'cancelled':
        ({ changes: changed } = await tx.exec(SQL.cancel, [o.sampleId, owner]));
        break;
    }
    applied.push(changed > 0);
  }
  return applied;
}

/**
 * PostgreSQL: the sample updates of a batch naming each sample once, one statement per kind of
 * outcome (the completed ones with their staging rows in the same statement), each row guarded as
 * in updateSamplesEach. Whether each outcome changed its sample.
 */
async function updateSamplesAtOnce(tx: DbOrTx, owner: string, batch: Outcome[]): Promise<boolean[]> {
  const changed = new Set<number>();
  const apply = async (text: string, params: unknown[]) => {
    for (const r of (await tx.exec<{ id: number }>(text, params)).rows) changed.add(Number(r.id));
  };
  const guard = `s.id = v.id and s.status = 'in_progress' and s.lease_owner = ?`;
  const cleared = 'lease_owner = null, lease_expires_at = null';

  const completed = batch.filter((o) => o.kind === 'completed');
  if (completed.length) {
    await apply(
      `with v as (
         select * from unnest(?::bigint[], ?::text[], ?::int[], ?::text[], ?::text[], ?::int[], ?::int[], ?::int[], ?::int[], ?::int[], ?::int[],
           ?::int[], ?::int[], ?::bigint[], ?::text[])
           as v(id, run_id, shard_idx, endpoint_id, finish_reason, prompt, completion, reasoning, cached, latency, flags, reasoning_chars,
             content_chars, at, output)
       ), done as (
         update samples as s set status = 'completed', endpoint_id = v.endpoint_id, finish_reason = v.finish_reason, prompt_tokens = v.prompt,
           completion_tokens = v.completion, reasoning_tokens = v.reasoning, cached_tokens = v.cached, latency_ms = v.latency, flags = v.flags,
           reasoning_chars = v.reasoning_chars, content_chars = v.content_chars, completed_at = v.at, error_code = null, error_message = null,
           error_status = null, ${cleared}
         from v where ${guard} returning s.id
       )
       insert into staging (sample_id, run_id, shard_idx, output)
         select v.id, v.run_id, v.shard_idx, v.output from v join done on done.id = v.id
       on conflict (sample_id) do update set run_id = excluded.run_id, shard_idx = excluded.shard_idx, output = excluded.output
       returning sample_id as id`,
      [
        completed.map((o) => o.sampleId),
        completed.map((o) => o.runId),
        completed.map((o) => o.shardIdx),
        completed.map((o) => o.endpointId),
        completed.map((o) => o.finishReason),
        completed.map((o) => o.usage.prompt_tokens),
        completed.map((o) => o.usage.completion_tokens),
        completed.map((o) => o.usage.reasoning_tokens),
        completed.map((o) => o.usage.cached_tokens),
        completed.map((o) => o.latencyMs),
        completed.map((o) => o.flags),
        completed.map((o) => o.chars.reasoning),
        completed.map((o) => o.chars.content),
        completed.map((o) => o.at),
        completed.map((o) => o.output),
        owner,
      ],
    );
  }

  const failed = batch.filter((o) => o.kind === 'failed');
  if (failed.length) {
    await apply(
      `update samples as s set status = 'failed', endpoint_id = v.endpoint_id, error_code = v.code, error_message = v.message,
         error_status = v.status, completed_at = v.at, ${cleared}
       from unnest(?::bigint[], ?::text[], ?::text[], ?::text[], ?::int[], ?::bigint[]) as v(id, endpoint_id, code, message, status, at)
       where ${guard} returning s.id`,
      [
        failed.map((o) => o.sampleId),
        failed.map((o) => o.endpointId),
        failed.map((o) => o.error.code),
        failed.map((o) => o.error.message),
        failed.map((o) => o.error.status),
        failed.map((o) => o.at),
        owner,
      ],
    );
  }

  const retried = batch.filter((o) => o.kind === 'retry');
  if (retried.length) {
    // As SQL.retry: a server's fault refunds the attempt and is counted instead.
    await apply(
      `update samples as s set status = 'pending', available_at = v.available_at, quality_retries = s.quality_retries + v.quality,
         attempts = case when s.attempts > v.fault then s.attempts - v.fault else 0 end, server_faults = s.server_faults + v.fault,
         error_code = v.code, error_message = v.message, error_status = v.status, ${cleared}
       from unnest(?::bigint[], ?::bigint[], ?::int[], ?::int[], ?::text[], ?::text[], ?::int[]) as v(id, available_at, quality, fault, code, message, status)
       where ${guard} returning s.id`,
      [
        retried.map((o) => o.sampleId),
        retried.map((o) => o.availableAt),
        retried.map((o) => (o.qualityRetry ? 1 : 0)),
        retried.map((o) => (o.serverFault ? 1 : 0)),
        retried.map((o) => o.error?.code ?? null),
        retried.map((o) => o.error?.message ?? null),
        retried.map((o) => o.error?.status ?? null),
        owner,
      ],
    );
  }

  for (const [kind, set] of [
    ['release', RELEASE_LEASE],
    ['cancelled', `status = 'cancelled', ${cleared}`],
  ] as const) {
    const ids = batch.filter((o) => o.kind === kind).map((o) => o.sampleId);
    if (ids.length) await apply(`update samples as s set ${set} from unnest(?::bigint[]) as v(id) where ${guard} returning s.id`, [ids, owner]);
  }
  return batch.map((o) => changed.has(o.sampleId));
}
