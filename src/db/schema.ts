import { sql } from 'drizzle-orm';
import { index, integer, primaryKey, real, sqliteTable, text, uniqueIndex } from 'drizzle-orm/sqlite-core';
import { FLAGS, flagBit } from '../domain/flags.js';
import type { InvalidLine } from '../domain/input-line.js';
import type { StoredForecast } from '../domain/forecast.js';
import type { QualityConfig } from '../domain/quality.js';
import type { Variant } from '../domain/variants.js';
import type { RunnerSnapshot } from '../domain/live-view.js';
import type { EndpointLoad } from '../domain/history.js';
import type { EndpointShare, ScheduleWindow } from '../domain/schedule.js';

// Timestamps are integer milliseconds since the epoch; the API renders them as RFC 3339.

export const endpoints = sqliteTable('endpoints', {
  id: text('id').primaryKey(),
  url: text('url').notNull().unique(),
  name: text('name').notNull(),
  apiKey: text('api_key'),
  model: text('model'),
  state: text('state').notNull().default('starting'),
  // Set by the user; when null the server's own max_running_requests (or the default) applies.
  maxConcurrency: integer('max_concurrency'),
  serverMaxRunning: integer('server_max_running'),
  // What the probes read of the server (docs/sglang.md "Capacity", "Models"): its KV pool in
  // tokens, its context length, and when its process started (a change means it restarted).
  kvTokens: integer('kv_tokens'),
  maxModelLen: integer('max_model_len'),
  startupTime: real('startup_time'),
  // Other names the endpoint answers to, as the operator registered them.
  aliases: text('aliases', { mode: 'json' }).$type<string[]>().notNull().default(sql`'[]'`),
  weight: real('weight').notNull().default(1),
  labels: text('labels', { mode: 'json' }).$type<Record<string, string>>().notNull().default(sql`'{}'`),
  lastError: text('last_error'),
  lastCheckedAt: integer('last_checked_at'),
  completed: integer('completed').notNull().default(0),
  failed: integer('failed').notNull().default(0),
  // Sharing the server with others' traffic (README "Sharing servers"): SGLang's `priority` sent on
  // regen's requests, the gateway's bulk class, and when the server refused the priority field.
  requestPriority: integer('request_priority'),
  bulkHeader: integer('bulk_header', { mode: 'boolean' }).notNull().default(false),
  priorityRefusedAt: integer('priority_refused_at'),
  share: text('share', { mode: 'json' }).$type<EndpointShare>(),
  // When regen may use the server (domain/schedule.ts): windows in an IANA zone, a lend's end, and
  // how long requests still running past them may finish before they are cancelled (null: wait).
  schedule: text('schedule', { mode: 'json' }).$type<ScheduleWindow[]>(),
  timezone: text('timezone').notNull().default('UTC'),
  lendUntil: integer('lend_until'),
  drainGraceMs: integer('drain_grace_ms'),
  createdAt: integer('created_at').notNull(),
  updatedAt: integer('updated_at').notNull(),
});

export const files = sqliteTable('files', {
  id: text('id').primaryKey(),
  filename: text('filename').notNull(),
  purpose: text('purpose').notNull(),
  bytes: integer('bytes').notNull(),
  objectKey: text('object_key').notNull(),
  // When its content is deleted (`expires_after`), and when that was done: the row stays, marked expired.
  expiresAt: integer('expires_at'),
  expiredAt: integer('expired_at'),
  createdAt: integer('created_at').notNull(),
});

export const runs = sqliteTable(
  'runs',
  {
    id: text('id').primaryKey(),
    name: text('name'),
    model: text('model').notNull(),
    status: text('status').notNull(),
    statusReason: text('status_reason'),
    createdAt: integer('created_at').notNull(),
    startedAt: integer('started_at'),
    finishedAt: integer('finished_at'),
    params: text('params', { mode: 'json' }).$type<Record<string, unknown>>().notNull(),
    input: text('input', { mode: 'json' }).$type<RunInput>().notNull(),
    shardSize: integer('shard_size').notNull(),
    // One run per output prefix: two would overwrite each other's shards and manifest.
    outputUri: text('output_uri').notNull().unique(),
    priority: integer('priority').notNull().default(0),
    metadata: text('metadata', { mode: 'json' }).$type<Record<string, string>>().notNull(),
    regenerate: text('regenerate'),
    // An agentic conversation's walk (README "Agentic conversations"); null on runs made before it existed: the defaults.
    toolPairing: text('tool_pairing'),
    onToolMismatch: text('on_tool_mismatch'),
    historyReasoning: text('history_reasoning'),
    // The server route its requests go to (domain/run-endpoint.ts); null on runs made before it existed: chat.
    endpoint: text('endpoint'),
    onInvalidLine: text('on_invalid_line').notNull(),
    quality: text('quality', { mode: 'json' }).$type<QualityConfig | null>(),
    gateOverridden: integer('gate_overridden', { mode: 'boolean' }).notNull().default(false),
    requestTimeoutMs: integer('request_timeout_ms').notNull(),
    maxAttempts: integer('max_attempts').notNull(),
    idempotencyKey: text('idempotency_key').unique(),
    requestHash: text('request_hash'),
    // Line errors found while validating: the first 100 are kept, all are counted.
    invalidLines: integer('invalid_lines').notNull().default(0),
    lineErrors: text('line_errors', { mode: 'json' }).$type<InvalidLine[]>().notNull().default(sql`'[]'`),
    // Counters kept in step with sample status by the code that changes it.
    total: integer('total').notNull().default(0),
    pending: integer('pending').notNull().default(0),
    inProgress: integer('in_progress').notNull().default(0),
    completed: integer('completed').notNull().default(0),
    failed: integer('failed').notNull().default(0),
    cancelled: integer('cancelled').notNull().default(0),
    flagged: integer('flagged').notNull().default(0),
    flagEmptyContent: integer('flag_empty_content').notNull().default(0),
    flagMissingReasoning: integer('flag_missing_reasoning').notNull().default(0),
    flagTruncated: integer('flag_truncated').notNull().default(0),
    flagRepetitive: integer('flag_repetitive').notNull().default(0),
    flagTooShort: integer('flag_too_short').notNull().default(0),
    flagDuplicateContent: integer('flag_duplicate_content').notNull().default(0),
    flagThinkInContent: integer('flag_think_in_content').notNull().default(0),
    flagShortForRun: integer('flag_short_for_run').notNull().default(0),
    flagToolCallInContent: integer('flag_tool_call_in_content').notNull().default(0),
    flagInvalidToolArguments: integer('flag_invalid_tool_arguments').notNull().default(0),
    flagUnknownTool: integer('flag_unknown_tool').notNull().default(0),
    flagToolMismatch: integer('flag_tool_mismatch').notNull().default(0),
    flagFewTrainable: integer('flag_few_trainable').notNull().default(0),
    promptTokens: integer('prompt_tokens').notNull().default(0),
    completionTokens: integer('completion_tokens').notNull().default(0),
    reasoningTokens: integer('reasoning_tokens').notNull().default(0),
    cachedTokens: integer('cached_tokens').notNull().default(0),
    // Answers cut while streaming because they looped, and the tokens that spared (README "The quality gate").
    loopsStopped: integer('loops_stopped').notNull().default(0),
    loopTokensSaved: integer('loop_tokens_saved').notNull().default(0),
    shardsTotal: integer('shards_total').notNull().default(0),
    shardsUploaded: integer('shards_uploaded').notNull().default(0),
    droppedResults: integer('dropped_results').notNull().default(0),
    manifestKey: text('manifest_key'),
    updatedAt: integer('updated_at').notNull(),
    // Set when the run was created as an OpenAI batch (POST /v1/batches); see src/services/batches/create.ts.
    batchId: text('batch_id').unique(),
    completionWindow: text('completion_window'),
    expiresAt: integer('expires_at'),
    expiredAt: integer('expired_at'),
    // The batch's output and error files are views of the run's shards, under these ids.
    outputFileId: text('output_file_id').unique(),
    errorFileId: text('error_file_id').unique(),
    // Their sizes, counted once per finish (`at` is the run's finished_at they were counted for).
    batchFileBytes: text('batch_file_bytes', { mode: 'json' }).$type<BatchFileBytes | null>(),
    // The output's lifetime after the run finishes (`output.expires_after`, a batch's `output_expires_after`),
    // in seconds, and when its objects were deleted (the run's row stays).
    outputExpiresAfter: integer('output_expires_after'),
    outputExpiredAt: integer('output_expired_at'),
    // Where the run's webhook events go. A run created with its own webhook keeps its secret here
    // (write-only, like an endpoint's api_key); one that took the server's default has only the URL,
    // and is signed with REGEN_WEBHOOK_SECRET.
    webhookUrl: text('webhook_url'),
    webhookSecret: text('webhook_secret'),
    // Its events by delivery status, kept in step with webhook_deliveries by the code that moves them.
    webhookPending: integer('webhook_pending').notNull().default(0),
    webhookDelivered: integer('webhook_delivered').notNull().default(0),
    webhookFailed: integer('webhook_failed').notNull().default(0),
    webhookLastError: text('webhook_last_error'),
    // The calibration slice asked for (samples, at most the input's size); 0 turns it off.
    calibrationSamples: integer('calibration_samples').notNull().default(0),
    // A dry run answers only its slice, then ends with the forecast for the whole input.
    dryRun: integer('dry_run', { mode: 'boolean' }).notNull().default(false),
    deadlineSeconds: integer('deadline_seconds'),
    // 'length_aware' pulls the longest predicted samples forward within a look-ahead window (runner/claim-buffer.ts).
    dispatchOrder: text('dispatch_order').notNull().default('input'),
    // How the shards are written (domain/output-format.ts): 'jsonl', 'conversations' or 'parquet'.
    outputFormat: text('output_format').notNull().default('jsonl'),
    // The share of samples written under eval/ (the rest under train/); null: no split, shards at the prefix's root.
    evalShare: real('eval_share'),
    // The run may replace files of the names it writes that it found in its prefix (output.overwrite).
    outputOverwrite: integer('output_overwrite', { mode: 'boolean' }).notNull().default(false),
    // The server's token ids and loss masks are written under tokens/ beside the text (output.tokens).
    outputTokens: integer('output_tokens', { mode: 'boolean' }).notNull().default(false),
    // A local output folder's identity when the run took it ("device:inode"); null on S3 and for older runs.
    outputFolder: text('output_folder'),
    // Samples with a predicted length: length-aware dispatch needs some.
    predictedSamples: integer('predicted_samples').notNull().default(0),
    // The runner's last forecast, kept so a finished run (a dry run above all) still shows it.
    forecast: text('forecast', { mode: 'json' }).$type<StoredForecast | null>(),
    // Named params each taken by a stable share of the samples (domain/variants.ts); null for none.
    variants: text('variants', { mode: 'json' }).$type<Variant[] | null>(),
    // What becomes of an answer cut by max_tokens: 'keep' (flagged truncated), 'retry' (more room), 'fail'.
    onLength: text('on_length').notNull().default('keep'),
    // A conversation run's turns (one request each): all of them once validated, the answered ones, the ones that failed their conversation.
    turnsTotal: integer('turns_total').notNull().default(0),
    turnsCompleted: integer('turns_completed').notNull().default(0),
    // The requests answered with tool calls (steps), among turns_completed.
    toolSteps: integer('tool_steps').notNull().default(0),
    turnsFailed: integer('turns_failed').notNull().default(0),
    // The most turns any of its conversations has: the longest chain of requests, the forecast's tail.
    turnsMax: integer('turns_max').notNull().default(0),
  },
  (t) => [index('runs_status_idx').on(t.status, t.priority, t.createdAt)],
);

export const shards = sqliteTable(
  'shards',
  {
    runId: text('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    idx: integer('idx').notNull(),
    status: text('status').notNull().default('open'),
    firstSeq: integer('first_seq').notNull(),
    sampleCount: integer('sample_count').notNull(),
    terminalCount: integer('terminal_count').notNull().default(0),
    key: text('key'),
    bytes: integer('bytes'),
    lines: integer('lines'),
    sha256: text('sha256'),
    errorsKey: text('errors_key'),
    errorsBytes: integer('errors_bytes'),
    errorsLines: integer('errors_lines'),
    errorsSha256: text('errors_sha256'),
    // The shard's training rows under tokens/ (output.tokens), and their trainable-token counts (JSON) for the loss mask's spread.
    tokensKey: text('tokens_key'),
    tokensBytes: integer('tokens_bytes'),
    tokensRows: integer('tokens_rows'),
    tokensSha256: text('tokens_sha256'),
    tokensTrainable: text('tokens_trainable'),
    // The digests of the files an upload of the shard was about to store or remove, recorded before
    // it touched any and cleared when the shard is marked (JSON, key → digests): an earlier file a
    // later upload reads back may be one of those, not the one recorded.
    pendingDigests: text('pending_digests'),
    uploadAttempts: integer('upload_attempts').notNull().default(0),
    // Bumped whenever samples of the shard are put back in the queue, so an upload that started
    // before can tell it is stale and must not mark the shard uploaded.
    generation: integer('generation').notNull().default(0),
    lastError: text('last_error'),
    // A split run's shard: its split, and the last seq of its samples (they are not contiguous then: see db/shards.ts).
    split: text('split'),
    lastSeq: integer('last_seq'),
    uploadedAt: integer('uploaded_at'),
  },
  (t) => [primaryKey({ columns: [t.runId, t.idx] }), index('shards_run_status_idx').on(t.runId, t.status)],
);

export const samples = sqliteTable(
  'samples',
  {
    id: integer('id').primaryKey({ autoIncrement: true }),
    runId: text('run_id').notNull(),
    seq: integer('seq').notNull(),
    shardIdx: integer('shard_idx').notNull(),
    customId: text('custom_id').notNull(),
    // Which of the params.n answers to its input line this sample is (0 when the run asks one).
    sampleIndex: integer('sample_index').notNull().default(0),
    status: text('status').notNull().default('pending'),
    // The request as sent: {messages, params?} in JSON, kept so a retry or restart can resend it.
    request: text('request').notNull(),
    attempts: integer('attempts').notNull().default(0),
    // Attempts lost to the server's faults (connection errors, timeouts, 5xx, aborts): refunded
    // from attempts and counted here against a budget of their own.
    serverFaults: integer('server_faults').notNull().default(0),
    qualityRetries: integer('quality_retries').notNull().default(0),
    availableAt: integer('available_at').notNull().default(0),
    leaseOwner: text('lease_owner'),
    leaseExpiresAt: integer('lease_expires_at'),
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
    // Lengths of the last answer's texts (UTF-16 code units), kept for the quality histograms.
    reasoningChars: integer('reasoning_chars'),
    contentChars: integer('content_chars'),
    errorCode: text('error_code'),
    errorMessage: text('error_message'),
    errorStatus: integer('error_status'),
    outputKey: text('output_key'),
    outputLine: integer('output_line'),
    completedAt: integer('completed_at'),
    // One of the run's calibration slice: claimed before the rest, its length a random sample of the input's.
    calibration: integer('calibration', { mode: 'boolean' }).notNull().default(false),
    // The new answer's length as the input's old assistant turn predicts it (regeneration only).
    predictedTokens: integer('predicted_tokens'),
    // The index of the sample's variant in its run's variants, chosen at ingest by custom_id; null when the run has none.
    variant: integer('variant'),
    // The max_tokens an on_length "retry" raised the sample to, sent over its params' own; null until then.
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
    // The slice only (at most a few hundred rows a run): its claim, and its lengths read back after a restart.
    index('samples_calibration_idx').on(t.runId, t.status, t.seq).where(sql`calibration = 1`),
    // The quality histograms count each bucket as a range of one of these, never reading a row
    // (rows carry the requests): one narrow index per measured column, completed samples only.
    index('samples_completion_tokens_idx').on(t.runId, t.completionTokens).where(sql`status = 'completed'`),
    index('samples_reasoning_chars_idx').on(t.runId, t.reasoningChars).where(sql`status = 'completed'`),
    index('samples_content_chars_idx').on(t.runId, t.contentChars).where(sql`status = 'completed'`),
    // One small index per flag, holding only the flagged samples: `?flag=` pages and the quality
    // examples walk them in input order however rare the flag is.
    ...FLAGS.map((f) =>
      index(`samples_flag_${f}_idx`)
        .on(t.runId, t.seq)
        .where(sql.raw(`(flags & ${flagBit(f)}) <> 0`)),
    ),
  ],
);

// A run's counters per variant, moved by the result writer in the transaction that moves the run's
// (db/results.ts), so the run object shows each variant's counts, usage and flags without a scan.
export const runVariants = sqliteTable(
  'run_variants',
  {
    runId: text('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    idx: integer('idx').notNull(),
    total: integer('total').notNull().default(0),
    completed: integer('completed').notNull().default(0),
    failed: integer('failed').notNull().default(0),
    flagged: integer('flagged').notNull().default(0),
    flagEmptyContent: integer('flag_empty_content').notNull().default(0),
    flagMissingReasoning: integer('flag_missing_reasoning').notNull().default(0),
    flagTruncated: integer('flag_truncated').notNull().default(0),
    flagRepetitive: integer('flag_repetitive').notNull().default(0),
    flagTooShort: integer('flag_too_short').notNull().default(0),
    flagDuplicateContent: integer('flag_duplicate_content').notNull().default(0),
    flagThinkInContent: integer('flag_think_in_content').notNull().default(0),
    flagShortForRun: integer('flag_short_for_run').notNull().default(0),
    flagToolCallInContent: integer('flag_tool_call_in_content').notNull().default(0),
    flagInvalidToolArguments: integer('flag_invalid_tool_arguments').notNull().default(0),
    flagUnknownTool: integer('flag_unknown_tool').notNull().default(0),
    flagToolMismatch: integer('flag_tool_mismatch').notNull().default(0),
    flagFewTrainable: integer('flag_few_trainable').notNull().default(0),
    promptTokens: integer('prompt_tokens').notNull().default(0),
    completionTokens: integer('completion_tokens').notNull().default(0),
    reasoningTokens: integer('reasoning_tokens').notNull().default(0),
    cachedTokens: integer('cached_tokens').notNull().default(0),
  },
  (t) => [primaryKey({ columns: [t.runId, t.idx] })],
);

// Completion text waits here until its shard is uploaded; then the shard object is the copy.
export const staging = sqliteTable(
  'staging',
  {
    sampleId: integer('sample_id').primaryKey(),
    runId: text('run_id').notNull(),
    shardIdx: integer('shard_idx').notNull(),
    output: text('output').notNull(),
  },
  (t) => [index('staging_shard_idx').on(t.runId, t.shardIdx)],
);

// A conversation's answered turns (`regenerate: "all_assistant"`), each committed before the next
// is claimed: the history the next turn is asked with, and the turns its output line reports.
export const sampleTurns = sqliteTable(
  'sample_turns',
  {
    sampleId: integer('sample_id').notNull(),
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
    // The server's token ids for the request (JSON { prompt, output }), when its run writes them (output.tokens).
    tokenIds: text('token_ids'),
  },
  (t) => [primaryKey({ columns: [t.sampleId, t.idx] }), index('sample_turns_run_idx').on(t.runId)],
);

export const events = sqliteTable(
  'events',
  {
    id: integer('id').primaryKey({ autoIncrement: true }),
    runId: text('run_id').notNull(),
    type: text('type').notNull(),
    data: text('data', { mode: 'json' }).$type<Record<string, unknown>>().notNull(),
    createdAt: integer('created_at').notNull(),
  },
  (t) => [index('events_run_idx').on(t.runId, t.id)],
);

// The outbox of webhook events: each written in the transaction of the change it tells of, and
// delivered at least once from here (src/services/webhooks.ts), a restart included.
export const webhookDeliveries = sqliteTable(
  'webhook_deliveries',
  {
    // The event id, sent as `webhook-id` on every attempt.
    id: text('id').primaryKey(),
    // The run the event is about, whose secret signs it; null for the server's own (to REGEN_WEBHOOK_URL).
    runId: text('run_id'),
    type: text('type').notNull(),
    url: text('url').notNull(),
    body: text('body').notNull(),
    status: text('status').notNull().default('pending'),
    attempts: integer('attempts').notNull().default(0),
    // When the next attempt is due; while an attempt is out, when its lease ends (it timed out).
    nextAttemptAt: integer('next_attempt_at').notNull(),
    lastError: text('last_error'),
    createdAt: integer('created_at').notNull(),
    deliveredAt: integer('delivered_at'),
  },
  (t) => [index('webhook_deliveries_due_idx').on(t.nextAttemptAt).where(sql`status = 'pending'`)],
);

// The forecast as it moved: one row every so often per run (see runner/forecasts.ts), for the
// dashboard's projected-finish chart.
export const forecasts = sqliteTable(
  'forecasts',
  {
    id: integer('id').primaryKey({ autoIncrement: true }),
    runId: text('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    at: integer('at').notNull(),
    finishesAt: integer('finishes_at'),
    lowAt: integer('low_at'),
    highAt: integer('high_at'),
    completionTokensEstimate: integer('completion_tokens_estimate').notNull(),
    fraction: real('fraction').notNull(),
  },
  (t) => [index('forecasts_run_idx').on(t.runId, t.at)],
);

// Throughput over time, for the fleet (run_id null) and each run, thinning as it ages
// (domain/history.ts); written by the runner (runner/history.ts), read by GET /v1/history.
export const history = sqliteTable(
  'history',
  {
    id: integer('id').primaryKey({ autoIncrement: true }),
    runId: text('run_id').references(() => runs.id, { onDelete: 'cascade' }),
    stepMs: integer('step_ms').notNull(),
    at: integer('at').notNull(),
    spanMs: integer('span_ms').notNull(),
    samples: integer('samples').notNull(),
    completionTokens: integer('completion_tokens').notNull(),
    promptTokens: integer('prompt_tokens').notNull(),
    cachedTokens: integer('cached_tokens').notNull(),
    inFlight: real('in_flight'),
    cap: real('cap'),
    endpoints: text('endpoints', { mode: 'json' }).$type<Record<string, EndpointLoad> | null>(),
  },
  (t) => [index('history_run_idx').on(t.runId, t.stepMs, t.at)],
);

// One row: on SQLite the process that runs dispatch on this database, so a restart can tell a
// dead owner's leases from a live one's; on PostgreSQL the replica that coordinates (recovery,
// shard uploads, finishing: src/runner/fleet/).
export const runnerLock = sqliteTable('runner_lock', {
  id: integer('id').primaryKey(),
  owner: text('owner').notNull(),
  pid: integer('pid').notNull(),
  hostname: text('hostname').notNull(),
  heartbeatAt: integer('heartbeat_at').notNull(),
});

// PostgreSQL only (empty on SQLite, where one process dispatches): each live `regen serve`, its
// heartbeat in the database's time and the live view it publishes (rates, in-flight counts:
// src/runner/view.ts), so every replica serves the whole fleet's.
export const replicas = sqliteTable('replicas', {
  owner: text('owner').primaryKey(),
  pid: integer('pid').notNull(),
  hostname: text('hostname').notNull(),
  heartbeatAt: integer('heartbeat_at').notNull(),
  view: text('view', { mode: 'json' }).$type<RunnerSnapshot | null>(),
});

// PostgreSQL only: which replica drives each endpoint. One driver at a time keeps the endpoint's
// cap whole across replicas (src/db/replicas.ts).
export const endpointDrivers = sqliteTable('endpoint_drivers', {
  endpointId: text('endpoint_id')
    .primaryKey()
    .references(() => endpoints.id, { onDelete: 'cascade' }),
  owner: text('owner').notNull(),
  since: integer('since').notNull(),
});

// Prompt and cached prompt tokens of each run's answers by endpoint: the prefix-cache hit rate per
// run and endpoint (db/cache-usage.ts), added to by the result writer.
export const runEndpointUsage = sqliteTable(
  'run_endpoint_usage',
  {
    runId: text('run_id')
      .notNull()
      .references(() => runs.id, { onDelete: 'cascade' }),
    endpointId: text('endpoint_id').notNull(),
    promptTokens: integer('prompt_tokens').notNull().default(0),
    cachedTokens: integer('cached_tokens').notNull().default(0),
  },
  (t) => [primaryKey({ columns: [t.runId, t.endpointId] })],
);

export type RunInput = { file_id: string } | { uri: string } | { requests: number };
export interface BatchFileBytes {
  at: number;
  output?: number;
  error?: number;
}

export type EndpointRow = typeof endpoints.$inferSelect;
export type FileRow = typeof files.$inferSelect;
export type RunRow = typeof runs.$inferSelect;
export type ShardRow = typeof shards.$inferSelect;
export type SampleRow = typeof samples.$inferSelect;
export type SampleTurnRow = typeof sampleTurns.$inferSelect;
export type WebhookDeliveryRow = typeof webhookDeliveries.$inferSelect;
