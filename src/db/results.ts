import { addCacheUsage, cacheUsageUpsert, type CacheUsage } from './cache-usage.js';
import type { SampleError } from '../domain/sample-errors.js';
import type { Usage } from '../domain/output-line.js';
import type { TurnRecord } from '../domain/conversation.js';
import { FLAG_COLUMNS, FLAGS, flagBit } from '../domain/flags.js';
import type { DbOrTx } from './client.js';
import { RELEASE_LEASE } from './samples.js';
import { addToVariantDelta, moveVariantCounters, newVariantDelta, type VariantDelta } from './run-variants.js';

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
  /** The index of the sample's variant, whose counters move with the run's; none when the run has none. */
  variant?: number | null;
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
      /** A conversation's last turn, stored with the others; `usage` and `latencyMs` are then the whole conversation's. */
      turn?: TurnRecord;
    })
  // A conversation's turn answered with more to ask: stored, and the sample back in the queue for
  // its next turn with a fresh attempt budget (the turn's own), and the params' own max_tokens: an
  // on_length retry's raise is the cut turn's (a later turn's longer prompt may leave less room).
  | (Base & { kind: 'turn'; turn: TurnRecord; flags: number })
  // `turn`: a conversation's, the turn that failed it.
  | (Base & { kind: 'failed'; error: SampleError; at: number; turn?: number })
  // Back to the queue: a retry after backoff (usage is what the failed or flagged attempt cost). After
  // a server's fault the attempt is refunded and the fault counted instead.
  | (Base & {
      kind: 'retry';
      availableAt: number;
      usage: Usage | null;
      qualityRetry: boolean;
      serverFault: boolean;
      error: SampleError | null;
      /** An answer cut by max_tokens under on_length "retry": the larger max_tokens the sample is sent with from now on. */
      maxTokens?: number;
    })
  // Back to the queue without spending an attempt: shutdown, pause, a sick endpoint.
  | (Base & { kind: 'release' })
  | (Base & { kind: 'cancelled' });

export interface FlushReport {
  /** Runs whose counters moved, with the completions added, the conversations moved on to their next turn and the turns answered. */
  runs: Map<string, { completed: number; tokens: number; turns?: number; turnsAnswered?: number }>;
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
  turnsCompleted: number;
  turnsFailed: number;
  toolSteps: number;
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
  turnsCompleted: 0,
  turnsFailed: 0,
  toolSteps: 0,
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
  retry: `update samples set status = 'pending', available_at = ?, quality_retries = quality_retries + ?, max_tokens = coalesce(?, max_tokens),
     attempts = case when attempts > ? then attempts - ? else 0 end,
     server_faults = server_faults + ?, error_code = ?, error_message = ?, error_status = ?, lease_owner = null, lease_expires_at = null ${GUARD}`,
  nextTurn: `update samples set status = 'pending', turn = turn + 1, attempts = 0, server_faults = 0, quality_retries = 0, max_tokens = null, available_at = ?, flags = ?,
     endpoint_id = ?, affinity_endpoint_id = ?, error_code = null, error_message = null, error_status = null, lease_owner = null, lease_expires_at = null
     ${GUARD} and turn = ?`,
  storeTurn: `insert into sample_turns (sample_id, idx, run_id, content, reasoning_content, finish_reason, prompt_tokens, completion_tokens, reasoning_tokens,
     cached_tokens, endpoint_id, latency_ms, attempts, flags, step, tool_calls, token_ids) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
     on conflict (sample_id, idx) do update set content = excluded.content, reasoning_content = excluded.reasoning_content,
     finish_reason = excluded.finish_reason, prompt_tokens = excluded.prompt_tokens, completion_tokens = excluded.completion_tokens,
     reasoning_tokens = excluded.reasoning_tokens, cached_tokens = excluded.cached_tokens, endpoint_id = excluded.endpoint_id,
     latency_ms = excluded.latency_ms, attempts = excluded.attempts, flags = excluded.flags, step = excluded.step, tool_calls = excluded.tool_calls,
     token_ids = excluded.token_ids`,
  affinity: `update samples set affinity_endpoint_id = ? where id = ?`,
  release: `update samples set ${RELEASE_LEASE} ${GUARD}`,
  cancel: `update samples set status = 'cancelled', lease_owner = null, lease_expires_at = null ${GUARD}`,
  runCounters: `update runs set pending = pending + ?, in_progress = in_progress + ?, completed = completed + ?, failed = failed + ?,
     cancelled = cancelled + ?, flagged = flagged + ?, ${FLAG_COLUMNS.map(({ column }) => `${column} = ${column} + ?`).join(', ')}, prompt_tokens = prompt_tokens + ?,
     completion_tokens = completion_tokens + ?, reasoning_tokens = reasoning_tokens + ?, cached_tokens = cached_tokens + ?, dropped_results = dropped_results + ?,
     loops_stopped = loops_stopped + ?, loop_tokens_saved = loop_tokens_saved + ?, turns_completed = turns_completed + ?, turns_failed = turns_failed + ?,
     tool_steps = tool_steps + ?, updated_at = ? where id = ?`,
  shardTerminal: `update shards set terminal_count = terminal_count + ? where run_id = ? and idx = ? returning terminal_count, sample_count`,
  endpointStats: `update endpoints set completed = completed + ?, failed = failed + ? where id = ?`,
};

/** Applies a batch of outcomes; call inside a transaction. */
export async function applyOutcomes(tx: DbOrTx, owner: string, batch: Outcome[], now: number): Promise<FlushReport> {
  const deltas = new Map<string, RunDelta>();
  const shardDeltas = new Map<string, { runId: string; idx: number; n: number }>();
  const endpointDeltas = new Map<string, { completed: number; failed: number }>();
  const variantDeltas = new Map<string, { runId: string; idx: number; d: VariantDelta }>();
  // Per run, per endpoint: the answered prompt and cached tokens (db/cache-usage.ts).
  const cacheDeltas = new Map<string, Map<string, CacheUsage>>();
  const report: FlushReport = { runs: new Map(), closedShards: [], dropped: 0 };
  // Whether each outcome changed its sample; the counters below move only for those.
  const applied =
    tx.dialect === 'pg' && new Set(batch.map((o) => o.sampleId)).size === batch.length
      ? await updateSamplesAtOnce(tx, owner, batch, now)
      : await updateSamplesEach(tx, owner, batch, now);
  await storeTurns(tx, batch, applied);
  for (const [i, o] of batch.entries()) {
    let d = deltas.get(o.runId);
    if (!d) deltas.set(o.runId, (d = newDelta()));
    if (!applied[i]) {
      d.dropped++;
      report.dropped++;
      continue;
    }
    // A conversation's last turn carries the conversation's totals for its row: the run adds this turn's only.
    const usage = o.kind === 'completed' ? (o.turn?.usage ?? o.usage) : o.kind === 'retry' ? o.usage : o.kind === 'turn' ? o.turn.usage : null;
    const terminal = o.kind === 'completed' || o.kind === 'failed' || o.kind === 'cancelled';
    if (o.kind === 'completed') {
      d.completed++;
      if (o.flags) d.flagged++;
      for (const [f, flag] of FLAGS.entries()) if (o.flags & flagBit(flag)) d.flags[f]++;
      if (o.turn) d.turnsCompleted++;
    } else if (o.kind === 'failed') {
      d.failed++;
      if (o.turn !== undefined) d.turnsFailed++;
    } else if (o.kind === 'cancelled') d.cancelled++;
    else {
      d.pending++;
      if (o.kind === 'turn') d.turnsCompleted++;
    }
    if ((o.kind === 'turn' || o.kind === 'completed') && o.turn?.toolCalls) d.toolSteps++;
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
    if (o.variant !== undefined && o.variant !== null) {
      const key = `${o.runId}\0${o.variant}`;
      let vd = variantDeltas.get(key);
      if (!vd) variantDeltas.set(key, (vd = { runId: o.runId, idx: o.variant, d: newVariantDelta() }));
      addToVariantDelta(vd.d, o.kind === 'completed' || o.kind === 'failed' ? o.kind : 'other', o.kind === 'completed' ? o.flags : 0, usage);
    }
    if (usage && o.endpointId) {
      let byEndpoint = cacheDeltas.get(o.runId);
      if (!byEndpoint) cacheDeltas.set(o.runId, (byEndpoint = new Map()));
      const c = byEndpoint.get(o.endpointId) ?? { endpointId: o.endpointId, promptTokens: 0, cachedTokens: 0 };
      c.promptTokens += usage.prompt_tokens;
      c.cachedTokens += usage.cached_tokens;
      byEndpoint.set(o.endpointId, c);
    }
    if (o.endpointId && (o.kind === 'completed' || o.kind === 'failed' || o.kind === 'turn')) {
      const e = endpointDeltas.get(o.endpointId) ?? { completed: 0, failed: 0 };
      e[o.kind === 'turn' ? 'completed' : o.kind]++;
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
      r.tokens += (o.turn?.usage ?? o.usage).completion_tokens;
      if (o.turn) r.turnsAnswered = (r.turnsAnswered ?? 0) + 1;
      report.runs.set(o.runId, r);
    }
    if (o.kind === 'turn') {
      const r = report.runs.get(o.runId) ?? { completed: 0, tokens: 0 };
      r.tokens += o.turn.usage.completion_tokens;
      r.turns = (r.turns ?? 0) + 1;
      r.turnsAnswered = (r.turnsAnswered ?? 0) + 1;
      report.runs.set(o.runId, r);
    }
  }
  for (const [runId, d] of deltas) {
    // On PostgreSQL the run's answered tokens by endpoint go in with its counters: no round trip of their own.
    const usage = tx.dialect === 'pg' ? cacheDeltas.get(runId) : undefined;
    if (usage) cacheDeltas.delete(runId);
    const upsert = usage ? cacheUsageUpsert([...usage.values()].map((u) => ({ runId, ...u }))) : null;
    await tx.exec(upsert ? `with usage as (${upsert.sql}) ${SQL.runCounters}` : SQL.runCounters, [
      ...(upsert?.params ?? []),
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
      d.turnsCompleted,
      d.turnsFailed,
      d.toolSteps,
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
  for (const { runId, idx, d } of variantDeltas.values()) await moveVariantCounters(tx, runId, idx, d);
  // SQLite's (a statement there is no round trip); on PostgreSQL every run's went in with its counters above.
  await addCacheUsage(tx, cacheDeltas);
  return report;
}

/**
 * A conversation's answered turn moves its sample on to the next one, due from `now`: how long it
 * has waited for its endpoint's driver counts from there (claimSamples); whether it did.
 */
async function nextTurn(tx: DbOrTx, owner: string, o: Extract<Outcome, { kind: 'turn' }>, now: number): Promise<boolean> {
  const { changes } = await tx.exec(SQL.nextTurn, [now, o.flags, o.endpointId, o.endpointId, o.sampleId, owner, o.turn.idx]);
  return changes > 0;
}

/**
 * The turns the batch answered, stored beside the sample updates that took them (in the same
 * transaction: a turn is never kept without its sample moving on, nor the reverse); a
 * conversation's last turn also leaves its endpoint as the one that holds its prefix.
 */
async function storeTurns(tx: DbOrTx, batch: Outcome[], applied: boolean[]): Promise<void> {
  const answered = batch.filter(
    (o, i): o is Extract<Outcome, { kind: 'turn' | 'completed' }> & { turn: TurnRecord } =>
      applied[i] && (o.kind === 'turn' || o.kind === 'completed') && o.turn !== undefined,
  );
  if (!answered.length) return;
  if (tx.dialect === 'pg') return storeTurnsAtOnce(tx, answered);
  for (const o of answered) {
    const t = o.turn;
    await tx.exec(SQL.storeTurn, [
      o.sampleId,
      t.idx,
      o.runId,
      t.content,
      t.reasoningContent,
      t.finishReason,
      t.usage.prompt_tokens,
      t.usage.completion_tokens,
      t.usage.reasoning_tokens,
      t.usage.cached_tokens,
      t.endpointId,
      t.latencyMs,
      t.attempts,
      t.flags,
      t.step,
      toolCallsText(t),
      idsText(t),
    ]);
    if (o.kind === 'completed') await tx.exec(SQL.affinity, [o.endpointId, o.sampleId]);
  }
}

const toolCallsText = (t: TurnRecord) => (t.toolCalls ? JSON.stringify(t.toolCalls) : null);
const idsText = (t: TurnRecord) => (t.ids ? JSON.stringify(t.ids) : null);

/** PostgreSQL: storeTurns in two statements, whatever the batch's size. */
async function storeTurnsAtOnce(tx: DbOrTx, answered: (Extract<Outcome, { kind: 'turn' | 'completed' }> & { turn: TurnRecord })[]): Promise<void> {
  const col = <T>(f: (t: TurnRecord) => T) => answered.map((o) => f(o.turn));
  await tx.exec(
    `insert into sample_turns (sample_id, idx, run_id, content, reasoning_content, finish_reason, prompt_tokens, completion_tokens, reasoning_tokens,
       cached_tokens, endpoint_id, latency_ms, attempts, flags, step, tool_calls, token_ids)
     select * from unnest(?::bigint[], ?::int[], ?::text[], ?::text[], ?::text[], ?::text[], ?::int[], ?::int[], ?::int[], ?::int[], ?::text[], ?::int[],
       ?::int[], ?::int[], ?::int[], ?::text[], ?::text[])
     on conflict (sample_id, idx) do update set content = excluded.content, reasoning_content = excluded.reasoning_content,
       finish_reason = excluded.finish_reason, prompt_tokens = excluded.prompt_tokens, completion_tokens = excluded.completion_tokens,
       reasoning_tokens = excluded.reasoning_tokens, cached_tokens = excluded.cached_tokens, endpoint_id = excluded.endpoint_id,
       latency_ms = excluded.latency_ms, attempts = excluded.attempts, flags = excluded.flags, step = excluded.step, tool_calls = excluded.tool_calls,
       token_ids = excluded.token_ids`,
    [
      answered.map((o) => o.sampleId),
      col((t) => t.idx),
      answered.map((o) => o.runId),
      col((t) => t.content),
      col((t) => t.reasoningContent),
      col((t) => t.finishReason),
      col((t) => t.usage.prompt_tokens),
      col((t) => t.usage.completion_tokens),
      col((t) => t.usage.reasoning_tokens),
      col((t) => t.usage.cached_tokens),
      col((t) => t.endpointId),
      col((t) => t.latencyMs),
      col((t) => t.attempts),
      col((t) => t.flags),
      col((t) => t.step),
      col(toolCallsText),
      col(idsText),
    ],
  );
  const last = answered.filter((o) => o.kind === 'completed');
  if (last.length) {
    await tx.exec(`update samples as s set affinity_endpoint_id = v.endpoint_id from unnest(?::bigint[], ?::text[]) as v(id, endpoint_id) where s.id = v.id`, [
      last.map((o) => o.sampleId),
      last.map((o) => o.endpointId),
    ]);
  }
}

/**
 * The sample updates one statement each, in the batch's order: SQLite's way (a statement costs no
 * round trip there), and PostgreSQL's for a batch naming a sample twice, where the second outcome
 * must find the first one's status. Whether each outcome changed its sample.
 */
async function updateSamplesEach(tx: DbOrTx, owner: string, batch: Outcome[], now: number): Promise<boolean[]> {
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
          o.maxTokens ?? null,
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
      case 'turn':
        changed = (await nextTurn(tx, owner, o, now)) ? 1 : 0;
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
async function updateSamplesAtOnce(tx: DbOrTx, owner: string, batch: Outcome[], now: number): Promise<boolean[]> {
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
         error_code = v.code, error_message = v.message, error_status = v.status, max_tokens = coalesce(v.max_tokens, s.max_tokens), ${cleared}
       from unnest(?::bigint[], ?::bigint[], ?::int[], ?::int[], ?::text[], ?::text[], ?::int[], ?::int[])
         as v(id, available_at, quality, fault, code, message, status, max_tokens)
       where ${guard} returning s.id`,
      [
        retried.map((o) => o.sampleId),
        retried.map((o) => o.availableAt),
        retried.map((o) => (o.qualityRetry ? 1 : 0)),
        retried.map((o) => (o.serverFault ? 1 : 0)),
        retried.map((o) => o.error?.code ?? null),
        retried.map((o) => o.error?.message ?? null),
        retried.map((o) => o.error?.status ?? null),
        retried.map((o) => o.maxTokens ?? null),
        owner,
      ],
    );
  }

  const turned = batch.filter((o) => o.kind === 'turn');
  if (turned.length) {
    // As SQL.nextTurn.
    await apply(
      `update samples as s set status = 'pending', turn = s.turn + 1, attempts = 0, server_faults = 0, quality_retries = 0, max_tokens = null, available_at = ?,
         flags = v.flags, endpoint_id = v.endpoint_id, affinity_endpoint_id = v.endpoint_id, error_code = null, error_message = null,
         error_status = null, ${cleared}
       from unnest(?::bigint[], ?::int[], ?::text[], ?::int[]) as v(id, flags, endpoint_id, turn)
       where ${guard} and s.turn = v.turn returning s.id`,
      [now, turned.map((o) => o.sampleId), turned.map((o) => o.flags), turned.map((o) => o.endpointId), turned.map((o) => o.turn.idx), owner],
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
