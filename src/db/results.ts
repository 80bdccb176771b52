import type { SampleError } from '../domain/sample-errors.js';
import type { Usage } from '../domain/output-line.js';
import { FLAG_COLUMNS, FLAGS, flagBit } from '../domain/flags.js';
import type { Db } from './client.js';
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

export type ResultStatements = ReturnType<typeof prepareResultStatements>;

export function prepareResultStatements(db: Db) {
  const guard = `where id = ? and status = 'in_progress' and lease_owner = ?`;
  return {
    complete: db.$client.prepare(
      `update samples set status = 'completed', endpoint_id = ?, finish_reason = ?, prompt_tokens = ?, completion_tokens = ?,
       reasoning_tokens = ?, cached_tokens = ?, latency_ms = ?, flags = ?, reasoning_chars = ?, content_chars = ?, completed_at = ?, error_code = null,
       error_message = null, error_status = null, lease_owner = null, lease_expires_at = null ${guard}`,
    ),
    stage: db.$client.prepare(`insert or replace into staging (sample_id, run_id, shard_idx, output) values (?, ?, ?, ?)`),
    fail: db.$client.prepare(
      `update samples set status = 'failed', endpoint_id = ?, error_code = ?, error_message = ?, error_status = ?, completed_at = ?,
       lease_owner = null, lease_expires_at = null ${guard}`,
    ),
    retry: db.$client.prepare(
      `update samples set status = 'pending', available_at = ?, quality_retries = quality_retries + ?, attempts = max(attempts - ?, 0),
       server_faults = server_faults + ?, error_code = ?, error_message = ?, error_status = ?, lease_owner = null, lease_expires_at = null ${guard}`,
    ),
    release: db.$client.prepare(`update samples set ${RELEASE_LEASE} ${guard}`),
    cancel: db.$client.prepare(`update samples set status = 'cancelled', lease_owner = null, lease_expires_at = null ${guard}`),
    runCounters: db.$client.prepare(
      `update runs set pending = pending + ?, in_progress = in_progress + ?, completed = completed + ?, failed = failed + ?,
       cancelled = cancelled + ?, flagged = flagged + ?, ${FLAG_COLUMNS.map(({ column }) => `${column} = ${column} + ?`).join(', ')}, prompt_tokens = prompt_tokens + ?,
       completion_tokens = completion_tokens + ?, reasoning_tokens = reasoning_tokens + ?, cached_tokens = cached_tokens + ?, dropped_results = dropped_results + ?,
       loops_stopped = loops_stopped + ?, loop_tokens_saved = loop_tokens_saved + ?, updated_at = ? where id = ?`,
    ),
    shardTerminal: db.$client.prepare(
      `update shards set terminal_count = terminal_count + ? where run_id = ? and idx = ? returning terminal_count, sample_count`,
    ),
    endpointStats: db.$client.prepare(`update endpoints set completed = completed + ?, failed = failed + ? where id = ?`),
  };
}

/** Applies a batch of outcomes; call inside a transaction. */
export function applyOutcomes(s: ResultStatements, owner: string, batch: Outcome[], now: number): FlushReport {
  const deltas = new Map<string, RunDelta>();
  const shardDeltas = new Map<string, { runId: string; idx: number; n: number }>();
  const endpointDeltas = new Map<string, { completed: number; failed: number }>();
  const report: FlushReport = { runs: new Map(), closedShards: [], dropped: 0 };
  for (const o of batch) {
    let d = deltas.get(o.runId);
    if (!d) deltas.set(o.runId, (d = newDelta()));
    let changed: number;
    let terminal = false;
    const usage = o.kind === 'completed' ? o.usage : o.kind === 'retry' ? o.usage : null;
    switch (o.kind) {
      case 'completed':
        changed = s.complete.run(
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
        ).changes;
        if (changed) {
          s.stage.run(o.sampleId, o.runId, o.shardIdx, o.output);
          d.completed++;
          if (o.flags) d.flagged++;
          for (const [i, f] of FLAGS.entries()) if (o.flags & flagBit(f)) d.flags[i]++;
          terminal = true;
        }
        break;
      case 'failed':
        changed = s.fail.run(o.endpointId, o.error.code, o.error.message, o.error.status, o.at, o.sampleId, owner).changes;
        if (changed) {
          d.failed++;
          terminal = true;
        }
        break;
      case 'retry':
        changed = s.retry.run(
          o.availableAt,
          o.qualityRetry ? 1 : 0,
          o.serverFault ? 1 : 0,
          o.serverFault ? 1 : 0,
          o.error?.code ?? null,
          o.error?.message ?? null,
          o.error?.status ?? null,
          o.sampleId,
          owner,
        ).changes;
        if (changed) d.pending++;
        break;
      case 'release':
        changed = s.release.run(o.sampleId, owner).changes;
        if (changed) d.pending++;
        break;
      case 'cancelled':
        changed = s.cancel.run(o.sampleId, owner).changes;
        if (changed) {
          d.cancelled++;
          terminal = true;
        }
        break;
    }
    if (!changed) {
      d.dropped++;
      report.dropped++;
      continue;
    }
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
    s.runCounters.run(
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
    );
    if (!report.runs.has(runId)) report.runs.set(runId, { completed: 0, tokens: 0 });
  }
  for (const sd of shardDeltas.values()) {
    const row = s.shardTerminal.get(sd.n, sd.runId, sd.idx) as { terminal_count: number; sample_count: number } | undefined;
    if (row && row.terminal_count === row.sample_count) report.closedShards.push({ runId: sd.runId, idx: sd.idx });
  }
  for (const [id, e] of endpointDeltas) s.endpointStats.run(e.completed, e.failed, id);
  return report;
}
