import type { RunRow, SampleRow, ShardRow } from '../../db/schema.js';
import type { RunVariantRow } from '../../db/run-variants.js';
import { hitRate, type CacheUsage } from '../../db/cache-usage.js';
import { joinUri } from '../../storage/index.js';
import { FLAG_COLUMNS, flagCounts, flagsFromBits } from '../../domain/flags.js';
import { runUsage, triesOf } from '../../domain/output-line.js';
import { endVerdict } from '../../domain/quality.js';
import { isTerminalRun } from '../../domain/statuses.js';
import { layeredParams, samplesPerLine } from '../../domain/run-settings.js';
import type { StoredForecast } from '../../domain/forecast.js';
import type { RunProgress } from '../../domain/live-view.js';
import type { TurnRecord } from '../../domain/conversation.js';
import { iso } from '../common.js';
import { runEndpoint } from '../../domain/run-endpoint.js';
import { outputExpiresAt } from '../../domain/expiry.js';
import { CARD_KEY, type OutputFormat, writesCard } from '../../domain/output-format.js';
import type { Run } from './schemas.js';

/**
 * How far a run is and how fast it goes. While it is worked on, the rates come from the runner's
 * sliding window; once it has finished, they are its averages over its actual duration (started to
 * finished), so a finished run reads what it did, not zero. The ETA is the forecast's remaining
 * wall time, else (no forecast yet) the samples still to do at the window's rate, and there is none
 * while the run is not being dispatched (paused, validating), the window is empty, or the run is a
 * dry run (its forecast is of the whole input, not of its slice).
 */
export function renderProgress(r: RunRow, live: RunProgress, now: number): Run['progress'] {
  const done = r.completed + r.failed + r.cancelled;
  const remaining = r.pending + r.inProgress;
  const dispatching = r.status === 'queued' || r.status === 'in_progress';
  // A paused run has no rate, though its window still holds the last minute's completions.
  const moving = dispatching || r.status === 'finalizing' || r.status === 'cancelling';
  const end = r.finishedAt ?? now;
  const elapsedMs = r.startedAt ? Math.max(0, end - r.startedAt) : 0;
  const finished = isTerminalRun(r.status) && r.finishedAt !== null && elapsedMs > 0;
  const rates = finished
    ? { samples: r.completed / (elapsedMs / 1000), tokens: r.completionTokens / (elapsedMs / 1000), turns: r.turnsCompleted / (elapsedMs / 1000) }
    : moving
      ? { samples: live.samples_per_second, tokens: live.completion_tokens_per_second, turns: live.turns_per_second ?? 0 }
      : { samples: 0, tokens: 0, turns: 0 };
  const inFlight = live.in_flight ?? 0;
  const perLine = samplesPerLine(r.params);
  return {
    fraction: r.total ? done / r.total : 0,
    samples_per_second: round(rates.samples),
    completion_tokens_per_second: round(rates.tokens),
    turns_per_second: r.regenerate === 'all_assistant' ? round(rates.turns) : null,
    // A request answers a line's n samples, so the requests go at the samples' rate over n.
    requests_per_second: perLine > 1 ? round(rates.samples / perLine) : null,
    eta_seconds: r.total > 0 && remaining === 0 ? 0 : dispatching && !r.dryRun ? eta(remaining, rates.samples, live.forecast) : null,
    elapsed_seconds: Math.round(elapsedMs / 1000),
    in_flight: inFlight,
    samples_in_flight: live.samples_in_flight ?? inFlight,
    turned_away: live.turned_away ?? 0,
    without_ids: dispatching ? (live.without_ids ?? []) : [],
  };
}

function eta(remaining: number, rate: number, forecast: StoredForecast | null): number | null {
  if (forecast?.wall_seconds_remaining != null) return Math.ceil(forecast.wall_seconds_remaining);
  return rate > 0 ? Math.ceil(remaining / rate) : null;
}

/**
 * While the run is dispatched, the runner's live forecast (else the last one it stored); once it is
 * not, the stored one alone: the runner stores its last forecast as the run settles, and a live one
 * still in the API thread's snapshot would make two reads of a finished run disagree.
 */
export function renderForecast(r: RunRow, live: RunProgress): Run['forecast'] {
  const dispatching = r.status === 'queued' || r.status === 'in_progress';
  const f = (dispatching ? live.forecast : null) ?? r.forecast;
  if (!f) return null;
  const { at, finishes_at, ...rest } = f;
  return { computed_at: iso(at)!, ...rest, finishes_at: iso(finishes_at) };
}

/** A run's variants with their counters (`rows`, by index; a variant without a row yet reads zeros); null when it has none. */
export function renderVariants(r: RunRow, rows: readonly RunVariantRow[]): Run['variants'] {
  if (!r.variants?.length) return null;
  const byIdx = new Map(rows.map((row) => [row.idx, row]));
  return r.variants.map((v, idx) => {
    const c = byIdx.get(idx);
    return {
      name: v.name,
      weight: v.weight,
      params: v.params ?? {},
      effective_params: layeredParams(r.params, v.params, null),
      request_counts: { total: c?.total ?? 0, completed: c?.completed ?? 0, failed: c?.failed ?? 0 },
      quality: { flagged: c?.flagged ?? 0, by_flag: c ? flagCounts(c) : flagCounts(ZERO_FLAGS) },
      usage: {
        prompt_tokens: c?.promptTokens ?? 0,
        completion_tokens: c?.completionTokens ?? 0,
        reasoning_tokens: c?.reasoningTokens ?? 0,
        cached_tokens: c?.cachedTokens ?? 0,
      },
      cache_hit_rate: c ? hitRate(c) : null,
    };
  });
}

const ZERO_FLAGS = Object.fromEntries(FLAG_COLUMNS.map(({ key }) => [key, 0])) as Parameters<typeof flagCounts>[0];

export function renderRun(r: RunRow, live: RunProgress, now: number, variantRows: readonly RunVariantRow[] = []): Run {
  return {
    id: r.id,
    object: 'run',
    name: r.name,
    model: r.model,
    status: r.status as Run['status'],
    status_reason: r.statusReason,
    created_at: iso(r.createdAt)!,
    started_at: iso(r.startedAt),
    finished_at: iso(r.finishedAt),
    params: r.params,
    shard_size: r.shardSize,
    output_uri: r.outputUri,
    output_format: r.outputFormat as Run['output_format'],
    output_overwrite: r.outputOverwrite,
    output_tokens: r.outputTokens,
    split: r.evalShare === null ? null : { eval: r.evalShare },
    priority: r.priority,
    metadata: r.metadata,
    input: r.input as Record<string, unknown>,
    endpoint: runEndpoint(r.endpoint),
    output_expires_at: iso(outputExpiresAt(r)),
    output_expired: r.outputExpiredAt !== null,
    regenerate: r.regenerate,
    tool_pairing: r.toolPairing as Run['tool_pairing'],
    on_tool_mismatch: r.onToolMismatch as Run['on_tool_mismatch'],
    history_reasoning: r.historyReasoning as Run['history_reasoning'],
    on_invalid_line: r.onInvalidLine as 'fail' | 'skip',
    request_timeout_ms: r.requestTimeoutMs,
    max_attempts: r.maxAttempts,
    quality_settings: r.quality ?? false,
    invalid_lines: {
      count: r.invalidLines,
      errors: r.lineErrors.map(({ line, message, custom_id }) => (custom_id === undefined ? { line, message } : { line, message, custom_id })),
    },
    request_counts: {
      total: r.total,
      pending: r.pending,
      in_progress: r.inProgress,
      completed: r.completed,
      failed: r.failed,
      cancelled: r.cancelled,
    },
    turns:
      r.regenerate === 'all_assistant'
        ? // A conversation has one request out at a time: its requests in flight are the run's (progress.in_flight).
          { total: r.turnsTotal, completed: r.turnsCompleted, in_flight: live.in_flight ?? 0, failed: r.turnsFailed, tool_steps: r.toolSteps }
        : null,
    quality: {
      flagged: r.flagged,
      by_flag: flagCounts(r),
    },
    usage: runUsage(r),
    cache_hit_rate: hitRate(r),
    shards: { total: r.shardsTotal, uploaded: r.shardsUploaded },
    progress: renderProgress(r, live, now),
    manifest_uri: r.manifestKey ? joinUri(r.outputUri, r.manifestKey) : null,
    card_uri: writesCard(r.outputFormat as OutputFormat, r.evalShare, r.outputTokens) ? joinUri(r.outputUri, CARD_KEY) : null,
    webhook: r.webhookUrl
      ? {
          url: r.webhookSecret ? r.webhookUrl : new URL(r.webhookUrl).origin,
          source: r.webhookSecret ? 'run' : 'server',
          secret_set: true,
          deliveries: { pending: r.webhookPending, delivered: r.webhookDelivered, failed: r.webhookFailed },
          last_error: r.webhookLastError,
        }
      : null,
    calibration: { samples: r.calibrationSamples },
    dry_run: r.dryRun,
    dispatch_order: r.dispatchOrder as Run['dispatch_order'],
    deadline_seconds: r.deadlineSeconds,
    forecast: renderForecast(r, live),
    on_length: r.onLength as Run['on_length'],
    variants: renderVariants(r, variantRows),
    ...renderEndWarnings(r),
  };
}

/** A completed run over the gate's limit says so in its warnings (the status_reason says it too when the gate is on and was not overridden). */
function renderEndWarnings(r: RunRow): Pick<Run, 'warnings'> {
  const verdict = r.status === 'completed' ? endVerdict(r) : null;
  return verdict ? { warnings: [{ code: 'quality_over_limit', field: 'quality.gate', message: verdict }] } : {};
}

/** A run's prefix-cache figures by endpoint, for GET of one run. */
export function renderCacheByEndpoint(usage: readonly (CacheUsage & { endpointName: string | null })[]): NonNullable<Run['cache_by_endpoint']> {
  return usage.map((u) => ({
    endpoint_id: u.endpointId,
    endpoint_name: u.endpointName,
    prompt_tokens: u.promptTokens,
    cached_tokens: u.cachedTokens,
    cache_hit_rate: hitRate(u),
  }));
}

const round = (n: number) => Math.round(n * 100) / 100;

/** A sample as lists show it; `variant` its variant's name, `turnsAnswered` a conversation's answered requests (null for other samples). */
export function renderSample(s: SampleRow, variant: string | null, turnsAnswered: number | null) {
  return {
    object: 'sample' as const,
    custom_id: s.customId,
    sample_index: s.sampleIndex,
    run_id: s.runId,
    index: s.seq,
    shard: s.shardIdx,
    status: s.status as 'pending',
    attempts: triesOf(s),
    server_faults: s.serverFaults,
    endpoint_id: s.endpointId,
    finish_reason: s.finishReason,
    usage:
      s.completionTokens == null
        ? null
        : {
            prompt_tokens: s.promptTokens ?? 0,
            completion_tokens: s.completionTokens ?? 0,
            reasoning_tokens: s.reasoningTokens ?? 0,
            cached_tokens: s.cachedTokens ?? 0,
          },
    latency_ms: s.latencyMs,
    flags: flagsFromBits(s.flags),
    error: s.errorCode ? { code: s.errorCode, message: s.errorMessage ?? '', status: s.errorStatus } : null,
    output_key: s.outputKey,
    output_line: s.outputLine,
    completed_at: iso(s.completedAt),
    turn: s.turn,
    turns_answered: turnsAnswered,
    variant,
  };
}

/** A conversation's request, `turn` the user turn it answers (turnLines counts them). */
export function renderTurn(t: TurnRecord, turn: number) {
  return {
    index: t.idx,
    turn,
    step: t.step,
    tool_calls: t.toolCalls,
    content: t.content,
    reasoning_content: t.reasoningContent,
    finish_reason: t.finishReason,
    usage: t.usage,
    endpoint_id: t.endpointId,
    latency_ms: t.latencyMs,
    attempts: t.attempts,
    flags: flagsFromBits(t.flags),
  };
}

export function renderShard(s: ShardRow) {
  return {
    object: 'shard' as const,
    index: s.idx,
    status: s.status as 'open' | 'uploaded',
    split: s.split as 'train' | 'eval' | null,
    samples: s.sampleCount,
    done: s.terminalCount,
    key: s.key,
    bytes: s.bytes,
    lines: s.lines,
    sha256: s.sha256,
    errors_key: s.errorsKey,
    errors_lines: s.errorsLines,
    upload_attempts: s.uploadAttempts,
    last_error: s.lastError,
    uploaded_at: iso(s.uploadedAt),
  };
}
