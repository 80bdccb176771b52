import { sql } from 'drizzle-orm';
import { bigint, boolean, doublePrecision, index, integer, jsonb, pgTable, primaryKey, text, uniqueIndex } from 'drizzle-orm/pg-core';
import { FLAGS, flagBit } from '../domain/flags.js';
import type { InvalidLine } from '../domain/input-line.js';
import type { StoredForecast } from '../domain/forecast.js';
import type { QualityConfig } from '../domain/quality.js';
import type { Variant } from '../domain/variants.js';
import type { RunnerSnapshot } from '../domain/live-view.js';
import type { EndpointLoad } from '../domain/history.js';
import type { EndpointShare, ScheduleWindow } from '../domain/schedule.js';
import type { BatchFileBytes, RunInput } from './schema.js';

// The tables of schema.ts for PostgreSQL: the same table, column and index names and the same JS
// properties, so a query written against one runs against the other. test/pg-schema.test.ts keeps
// the two in step.
//
// SQLite's integer is 64-bit; PostgreSQL's is not. What can pass 2^31 is bigint here: millisecond
// timestamps, token sums, bytes, seq and the per-run sample counters (bounded by seq only). What
// stays integer is bounded by the API or by one answer: attempts, limits, shard indexes, the
// tokens and characters of one sample, and samples.flags (a bitmask that the flag indexes and
// queries test with `&`). JSON columns are jsonb; webhook_deliveries.body and samples.request stay
// text because their exact bytes matter (a signed body, a request resent as stored).

/** A 64-bit integer read back as a JS number (exact up to 2^53, as SQLite's are through better-sqlite3). */
const bigintNumber = <N extends string>(name: N) => bigint(name, { mode: 'number' });

export const endpoints = pgTable('endpoints', {
  id: text('id').primaryKey(),
  url: text('url').notNull().unique(),
  name: text('name').notNull(),
  apiKey: text('api_key'),
  model: text('model'),
  state: text('state').notNull().default('starting'),
  maxConcurrency: integer('max_concurrency'),
  serverMaxRunning: integer('server_max_running'),
  kvTokens: bigintNumber('kv_tokens'),
  maxModelLen: integer('max_model_len'),
  startupTime: doublePrecision('startup_time'),
  aliases: jsonb('aliases').$type<string[]>().notNull().default(sql`'[]'::jsonb`),
  weight: doublePrecision('weight').notNull().default(1),
  labels: jsonb('labels').$type<Record<string, string>>().notNull().default(sql`'{}'::jsonb`),
  lastError: text('last_error'),
  lastCheckedAt: bigintNumber('last_checked_at'),
  // Samples answered over the endpoint's lifetime, across runs.
  completed: bigintNumber('completed').notNull().default(0),
  failed: bigintNumber('failed').notNull().default(0),
  requestPriority: integer('request_priority'),
  bulkHeader: boolean('bulk_header').notNull().default(false),
  priorityRefusedAt: bigintNumber('priority_refused_at'),
  share: jsonb('share').$type<EndpointShare>(),
  schedule: jsonb('schedule').$type<ScheduleWindow[]>(),
  timezone: text('timezone').notNull().default('UTC'),
  lendUntil: bigintNumber('lend_until'),
  drainGraceMs: integer('drain_grace_ms'),
  createdAt: bigintNumber('created_at').notNull(),
  updatedAt: bigintNumber('updated_at').notNull(),
});

export const files = pgTable('files', {
  id: text('id').primaryKey(),
  filename: text('filename').notNull(),
  purpose: text('purpose').notNull(),
  bytes: bigintNumber('bytes').notNull(),
  objectKey: text('object_key').notNull(),
  // When its content is deleted (`expires_after`), and when that was done: the row stays, marked expired.
  expiresAt: bigintNumber('expires_at'),
  expiredAt: bigintNumber('expired_at'),
  createdAt: bigintNumber('created_at').notNull(),
});

export const runs = pgTable(
  'runs',
  {
    id: text('id').primaryKey(),
    name: text('name'),
    model: text('model').notNull(),
    status: text('status').notNull(),
    statusReason: text('status_reason'),
    createdAt: bigintNumber('created_at').notNull(),
    startedAt: bigintNumber('started_at'),
    finishedAt: bigintNumber('finished_at'),
    params: jsonb('params').$type<Record<string, unknown>>().notNull(),
    input: jsonb('input').$type<RunInput>().notNull(),
    shardSize: integer('shard_size').notNull(),
    // One run per output prefix: two would overwrite each other's shards and manifest.
    outputUri: text('output_uri').notNull().unique(),
    priority: integer('priority').notNull().default(0),
    metadata: jsonb('metadata').$type<Record<string, string>>().notNull(),
    regenerate: text('regenerate'),
    // An agentic conversation's walk (README "Agentic conversations"); null on runs made before it existed: the defaults.
    toolPairing: text('tool_pairing'),
    onToolMismatch: text('on_tool_mismatch'),
    historyReasoning: text('history_reasoning'),
    // The server route its requests go to (domain/run-endpoint.ts); null on runs made before it existed: chat.
    endpoint: text('endpoint'),
    onInvalidLine: text('on_invalid_line').notNull(),
    quality: jsonb('quality').$type<QualityConfig | null>(),
    gateOverridden: boolean('gate_overridden').notNull().default(false),
    requestTimeoutMs: integer('request_timeout_ms').notNull(),
    maxAttempts: integer('max_attempts').notNull(),
    idempotencyKey: text('idempotency_key').unique(),
    requestHash: text('request_hash'),
    invalidLines: bigintNumber('invalid_lines').notNull().default(0),
    lineErrors: jsonb('line_errors').$type<InvalidLine[]>().notNull().default(sql`'[]'::jsonb`),
    total: bigintNumber('total').notNull().default(0),
    pending: bigintNumber('pending').notNull().default(0),
    inProgress: bigintNumber('in_progress').notNull().default(0),
    completed: bigintNumber('completed').notNull().default(0),
    failed: bigintNumber('failed').notNull().default(0),
    cancelled: bigintNumber('cancelled').notNull().default(0),
    flagged: bigintNumber('flagged').notNull().default(0),
    flagEmptyContent: bigintNumber('flag_empty_content').notNull().default(0),
    flagMissingReasoning: bigintNumber('flag_missing_reasoning').notNull().default(0),
    flagTruncated: bigintNumber('flag_truncated').notNull().default(0),
    flagRepetitive: bigintNumber('flag_repetitive').notNull().default(0),
    flagTooShort: bigintNumber('flag_too_short').notNull().default(0),
    flagDuplicateContent: bigintNumber('flag_duplicate_content').notNull().default(0),
    flagThinkInContent: bigintNumber('flag_think_in_content').notNull().default(0),
    flagShortForRun: bigintNumber('flag_short_for_run').notNull().default(0),
    flagToolCallInContent: bigintNumber('flag_tool_call_in_content').notNull().default(0),
    flagInvalidToolArguments: bigintNumber('flag_invalid_tool_arguments').notNull().default(0),
    flagUnknownTool: bigintNumber('flag_unknown_tool').notNull().default(0),
    flagToolMismatch: bigintNumber('flag_tool_mismatch').notNull().default(0),
    flagFewTrainable: bigintNumber('flag_few_trainable').notNull().default(0),
    promptTokens: bigintNumber('prompt_tokens').notNull().default(0),
    completionTokens: bigintNumber('completion_tokens').notNull().default(0),
    reasoningTokens: bigintNumber('reasoning_tokens').notNull().default(0),
    cachedTokens: bigintNumber('cached_tokens').notNull().default(0),
    loopsStopped: bigintNumber('loops_stopped').notNull().default(0),
    loopTokensSaved: bigintNumber('loop_tokens_saved').notNull().default(0),
    shardsTotal: integer('shards_total').notNull().default(0),
    shardsUploaded: integer('shards_uploaded').notNull().default(0),
    droppedResults: bigintNumber('dropped_results').notNull().default(0),
    manifestKey: text('manifest_key'),
    updatedAt: bigintNumber('updated_at').notNull(),
    batchId: text('batch_id').unique(),
    completionWindow: text('completion_window'),
    expiresAt: bigintNumber('expires_at'),
    expiredAt: bigintNumber('expired_at'),
    outputFileId: text('output_file_id').unique(),
    errorFileId: text('error_file_id').unique(),
    batchFileBytes: jsonb('batch_file_bytes').$type<BatchFileBytes | null>(),
    // The output's lifetime after the run finishes (`output.expires_after`, a batch's `output_expires_after`),
    // in seconds, and when its objects were deleted (the run's row stays).
    outputExpiresAfter: integer('output_expires_after'),
    outputExpiredAt: bigintNumber('output_expired_at'),
    webhookUrl: text('webhook_url'),
    webhookSecret: text('webhook_secret'),
    webhookPending: integer('webhook_pending').notNull().default(0),
    webhookDelivered: integer('webhook_delivered').notNull().default(0),
    webhookFailed: integer('webhook_failed').notNull().default(0),
    webhookLastError: text('webhook_last_error'),
    calibrationSamples: integer('calibration_samples').notNull().default(0),
    dryRun: boolean('dry_run').notNull().default(false),
    deadlineSeconds: integer('deadline_seconds'),
    dispatchOrder: text('dispatch_order').notNull().default('input'),
    // How the shards are written (domain/output-format.ts): 'jsonl', 'conversations' or 'parquet'.
    outputFormat: text('output_format').notNull().default('jsonl'),
    // The share of samples written under eval/ (the rest under train/); null: no split, shards at the prefix's root.
    evalShare: doublePrecision('eval_share'),
    outputOverwrite: boolean('output_overwrite').notNull().default(false),
    outputTokens: boolean('output_tokens').notNull().default(false),
    outputFolder: text('output_folder'),
    predictedSamples: bigintNumber('predicted_samples').notNull().default(0),
    forecast: jsonb('forecast').$type<StoredForecast | null>(),
    variants: jsonb('variants').$type<Variant[] | null>(),
    onLength: text('on_length').notNull().default('keep'),
    // A conversation run's turns (one request each): all of them once validated, the answered ones, the ones that failed their conversation.
    turnsTotal: bigintNumber('turns_total').notNull().default(0),
    turnsCompleted: bigintNumber('turns_completed').notNull().default(0),
    // The requests answered with tool calls (steps), among turns_completed.
    toolSteps: bigintNumber('tool_steps').notNull().default(0),
    turnsFailed: bigintNumber('turns_failed').notNull().default(0),
    // The most turns any of its conversations has: the longest chain of requests, the forecast's tail.
    turnsMax: integer('turns_max').notNull().default(0),
  },
  (t) => [index('runs_status_idx').on(t.status, t.priority, t.createdAt)],
);

export const shards = pgTable(
  'shards',
  {
    runId: text('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    idx: integer('idx').notNull(),
    status: text('status').notNull().default('open'),
    firstSeq: bigintNumber('first_seq').notNull(),
    sampleCount: integer('sample_count').notNull(),
    terminalCount: integer('terminal_count').notNull().default(0),
    key: text('key'),
    bytes: bigintNumber('bytes'),
    lines: integer('lines'),
    sha256: text('sha256'),
    errorsKey: text('errors_key'),
    errorsBytes: bigintNumber('errors_bytes'),
    errorsLines: integer('errors_lines'),
    errorsSha256: text('errors_sha256'),
    tokensKey: text('tokens_key'),
    tokensBytes: bigintNumber('tokens_bytes'),
    tokensRows: integer('tokens_rows'),
    tokensSha256: text('tokens_sha256'),
    tokensTrainable: text('tokens_trainable'),
    // The digests of the files an upload of the shard was about to store or remove, recorded before
    // it touched any and cleared when the shard is marked (JSON, key → digests): an earlier file a
    // later upload reads back may be one of those, not the one recorded.
    pendingDigests: text('pending_digests'),
    uploadAttempts: integer('upload_attempts').notNull().default(0),
    generation: integer('generation').notNull().default(0),
    lastError: text('last_error'),
    // A split run's shard: its split, and the last seq of its samples (they are not contiguous then: see db/shards.ts).
    split: text('split'),
    lastSeq: bigintNumber('last_seq'),
    uploadedAt: bigintNumber('uploaded_at'),
  },
  (t) => [primaryKey({ columns: [t.runId, t.idx] }), index('shards_run_status_idx').on(t.runId, t.status)],
);

export const samples = pgTable(
  'samples',
  {
    // By default rather than always: like SQLite's AUTOINCREMENT, it still takes an id given explicitly.
    id: bigintNumber('id').primaryKey().generatedByDefaultAsIdentity(),
    runId: text('run_id').notNull(),
    seq: bigintNumber('seq').notNull(),
    shardIdx: integer('shard_idx').notNull(),
    customId: text('custom_id').notNull(),
    // Which of the params.n answers to its input line this sample is (0 when the run asks one).
    sampleIndex: integer('sample_index').notNull().default(0),
    status: text('status').notNull().default('pending'),
    request: text('request').notNull(),
    attempts: integer('attempts').notNull().default(0),
    serverFaults: integer('server_faults').notNull().default(0),
    qualityRetries: integer('quality_retries').notNull().default(0),
    availableAt: bigintNumber('available_at').notNull().default(0),
    leaseOwner: text('lease_owner'),
    leaseExpiresAt: bigintNumber('lease_expires_at'),
    endpointId: text('endpoint_id'),
    // The endpoint whose prefix cache holds the sample's prompt (a conversation's previous turn was answered there): dispatch sends it there first (runner/pump.ts).
    affinityEndpointId: text('affinity_endpoint_id'),
    finishReason: text('finish_reason'),
    promptTokens: integer('prompt_tokens'),
    completionTokens: integer('completion_tokens'),
    reasoningTokens: integer('reasoning_tokens'),
    cachedTokens: integer('cached_tokens'),
    latencyMs: integer('latency_ms'),
    flags: integer('flags').notNull().default(0),
    reasoningChars: integer('reasoning_chars'),
    contentChars: integer('content_chars'),
    errorCode: text('error_code'),
    errorMessage: text('error_message'),
    errorStatus: integer('error_status'),
    outputKey: text('output_key'),
    outputLine: integer('output_line'),
    completedAt: bigintNumber('completed_at'),
    calibration: boolean('calibration').notNull().default(false),
    predictedTokens: integer('predicted_tokens'),
    variant: integer('variant'),
    maxTokens: integer('max_tokens'),
    // 'train' or 'eval' in a run with a split (domain/assign.ts pickSplit), else null.
    split: text('split'),
    // A conversation's (`regenerate: "all_assistant"`): the request being asked, 0-based (its user turns and tool-call
    // steps in order, as sample_turns.idx counts them); null for a single request.
    turn: integer('turn'),
  },
  (t) => [
    uniqueIndex('samples_run_custom_id').on(t.runId, t.customId, t.sampleIndex),
    index('samples_claim_idx').on(t.runId, t.status, t.seq),
    index('samples_run_seq_idx').on(t.runId, t.seq),
    // Conversations under way waiting for their next turn: claimed before new ones (db/samples.ts claimSamples).
    index('samples_underway_idx').on(t.runId, t.seq).where(sql`status = 'pending' AND turn > 0`),
    // SQLite's predicate is `calibration = 1`; here the column is a boolean.
    index('samples_calibration_idx').on(t.runId, t.status, t.seq).where(sql`calibration`),
    index('samples_completion_tokens_idx').on(t.runId, t.completionTokens).where(sql`status = 'completed'`),
    index('samples_reasoning_chars_idx').on(t.runId, t.reasoningChars).where(sql`status = 'completed'`),
    index('samples_content_chars_idx').on(t.runId, t.contentChars).where(sql`status = 'completed'`),
    ...FLAGS.map((f) =>
      index(`samples_flag_${f}_idx`)
        .on(t.runId, t.seq)
        .where(sql.raw(`(flags & ${flagBit(f)}) <> 0`)),
    ),
  ],
);

export const runVariants = pgTable(
  'run_variants',
  {
    runId: text('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    idx: integer('idx').notNull(),
    total: bigintNumber('total').notNull().default(0),
    completed: bigintNumber('completed').notNull().default(0),
    failed: bigintNumber('failed').notNull().default(0),
    flagged: bigintNumber('flagged').notNull().default(0),
    flagEmptyContent: bigintNumber('flag_empty_content').notNull().default(0),
    flagMissingReasoning: bigintNumber('flag_missing_reasoning').notNull().default(0),
    flagTruncated: bigintNumber('flag_truncated').notNull().default(0),
    flagRepetitive: bigintNumber('flag_repetitive').notNull().default(0),
    flagTooShort: bigintNumber('flag_too_short').notNull().default(0),
    flagDuplicateContent: bigintNumber('flag_duplicate_content').notNull().default(0),
    flagThinkInContent: bigintNumber('flag_think_in_content').notNull().default(0),
    flagShortForRun: bigintNumber('flag_short_for_run').notNull().default(0),
    flagToolCallInContent: bigintNumber('flag_tool_call_in_content').notNull().default(0),
    flagInvalidToolArguments: bigintNumber('flag_invalid_tool_arguments').notNull().default(0),
    flagUnknownTool: bigintNumber('flag_unknown_tool').notNull().default(0),
    flagToolMismatch: bigintNumber('flag_tool_mismatch').notNull().default(0),
    flagFewTrainable: bigintNumber('flag_few_trainable').notNull().default(0),
    promptTokens: bigintNumber('prompt_tokens').notNull().default(0),
    completionTokens: bigintNumber('completion_tokens').notNull().default(0),
    reasoningTokens: bigintNumber('reasoning_tokens').notNull().default(0),
    cachedTokens: bigintNumber('cached_tokens').notNull().default(0),
  },
  (t) => [primaryKey({ columns: [t.runId, t.idx] })],
);

export const staging = pgTable(
  'staging',
  {
    sampleId: bigintNumber('sample_id').primaryKey(),
    runId: text('run_id').notNull(),
    shardIdx: integer('shard_idx').notNull(),
    output: text('output').notNull(),
  },
  (t) => [index('staging_shard_idx').on(t.runId, t.shardIdx)],
);

// A conversation's answered turns (`regenerate: "all_assistant"`), each committed before the next
// is claimed: the history the next turn is asked with, and the turns its output line reports.
export const sampleTurns = pgTable(
  'sample_turns',
  {
    sampleId: bigintNumber('sample_id').notNull(),
    idx: integer('idx').notNull(),
    runId: text('run_id').notNull(),
    content: text('content'),
    reasoningContent: text('reasoning_content'),
    finishReason: text('finish_reason'),
    promptTokens: integer('prompt_tokens').notNull(),
    completionTokens: integer('completion_tokens').notNull(),
    reasoningTokens: integer('reasoning_tokens').notNull(),
    cachedTokens: integer('cached_tokens').notNull(),
    endpointId: text('endpoint_id'),
    latencyMs: integer('latency_ms').notNull(),
    attempts: integer('attempts').notNull(),
    flags: integer('flags').notNull().default(0),
    // The request's place in its user turn: 0 for the turn's first, then one more per tool-call step before it.
    step: integer('step').notNull().default(0),
    // The target's tool calls (JSON), when the answer was a step; null for a text answer.
    toolCalls: text('tool_calls'),
    tokenIds: text('token_ids'),
  },
  (t) => [primaryKey({ columns: [t.sampleId, t.idx] }), index('sample_turns_run_idx').on(t.runId)],
);

export const events = pgTable(
  'events',
  {
    id: bigintNumber('id').primaryKey().generatedByDefaultAsIdentity(),
    runId: text('run_id').notNull(),
    type: text('type').notNull(),
    data: jsonb('data').$type<Record<string, unknown>>().notNull(),
    createdAt: bigintNumber('created_at').notNull(),
  },
  (t) => [index('events_run_idx').on(t.runId, t.id)],
);

export const webhookDeliveries = pgTable(
  'webhook_deliveries',
  {
    id: text('id').primaryKey(),
    runId: text('run_id'),
    type: text('type').notNull(),
    url: text('url').notNull(),
    body: text('body').notNull(),
    status: text('status').notNull().default('pending'),
    attempts: integer('attempts').notNull().default(0),
    nextAttemptAt: bigintNumber('next_attempt_at').notNull(),
    lastError: text('last_error'),
    createdAt: bigintNumber('created_at').notNull(),
    deliveredAt: bigintNumber('delivered_at'),
  },
  (t) => [index('webhook_deliveries_due_idx').on(t.nextAttemptAt).where(sql`status = 'pending'`)],
);

export const forecasts = pgTable(
  'forecasts',
  {
    id: bigintNumber('id').primaryKey().generatedByDefaultAsIdentity(),
    runId: text('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    at: bigintNumber('at').notNull(),
    finishesAt: bigintNumber('finishes_at'),
    lowAt: bigintNumber('low_at'),
    highAt: bigintNumber('high_at'),
    completionTokensEstimate: bigintNumber('completion_tokens_estimate').notNull(),
    fraction: doublePrecision('fraction').notNull(),
  },
  (t) => [index('forecasts_run_idx').on(t.runId, t.at)],
);

// Throughput over time, for the fleet (run_id null) and each run, thinning as it ages
// (domain/history.ts); written by the runner (runner/history.ts), read by GET /v1/history.
export const history = pgTable(
  'history',
  {
    id: bigintNumber('id').primaryKey().generatedByDefaultAsIdentity(),
    runId: text('run_id').references(() => runs.id, { onDelete: 'cascade' }),
    stepMs: integer('step_ms').notNull(),
    at: bigintNumber('at').notNull(),
    spanMs: integer('span_ms').notNull(),
    samples: bigintNumber('samples').notNull(),
    completionTokens: bigintNumber('completion_tokens').notNull(),
    promptTokens: bigintNumber('prompt_tokens').notNull(),
    cachedTokens: bigintNumber('cached_tokens').notNull(),
    inFlight: doublePrecision('in_flight'),
    cap: doublePrecision('cap'),
    endpoints: jsonb('endpoints').$type<Record<string, EndpointLoad> | null>(),
  },
  (t) => [index('history_run_idx').on(t.runId, t.stepMs, t.at)],
);

export const runnerLock = pgTable('runner_lock', {
  id: integer('id').primaryKey(),
  owner: text('owner').notNull(),
  pid: integer('pid').notNull(),
  hostname: text('hostname').notNull(),
  heartbeatAt: bigintNumber('heartbeat_at').notNull(),
});

export const replicas = pgTable('replicas', {
  owner: text('owner').primaryKey(),
  pid: integer('pid').notNull(),
  hostname: text('hostname').notNull(),
  heartbeatAt: bigintNumber('heartbeat_at').notNull(),
  view: jsonb('view').$type<RunnerSnapshot | null>(),
});

// Prompt and cached prompt tokens of each run's answers by endpoint: the prefix-cache hit rate per
// run and endpoint (db/cache-usage.ts), added to by the result writer.
export const runEndpointUsage = pgTable(
  'run_endpoint_usage',
  {
    runId: text('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    endpointId: text('endpoint_id').notNull(),
    promptTokens: bigintNumber('prompt_tokens').notNull().default(0),
    cachedTokens: bigintNumber('cached_tokens').notNull().default(0),
  },
  (t) => [primaryKey({ columns: [t.runId, t.endpointId] })],
);

export const endpointDrivers = pgTable('endpoint_drivers', {
  endpointId: text('endpoint_id')
    .primaryKey()
    .references(() => endpoints.id, { onDelete: 'cascade' }),
  owner: text('owner').notNull(),
  since: bigintNumber('since').notNull(),
});
