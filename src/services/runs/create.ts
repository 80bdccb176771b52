import { createHash } from 'node:crypto';
import type { Deps } from '../../deps.js';
import { isUniqueViolation } from '../../db/client.js';
import { ApiError } from '../../errors.js';
import { newId } from '../../ids.js';
import { appendEvent } from '../../db/events.js';
import { deleteFile, getFile, insertFile } from '../../db/files.js';
import { getRun, getRunByIdempotencyKey, getRunOverlappingOutput } from '../../db/runs.js';
import type { runs, RunInput, RunRow } from '../../db/schema.js';
import { DEFAULT_CALIBRATION_SAMPLES } from '../../domain/forecast.js';
import {
  type DispatchOrder,
  type HistoryReasoning,
  layeredParams,
  type OnInvalidLine,
  type OnLength,
  type RegenerateMode,
  samplesPerLineProblem,
  type ToolMismatchAction,
  type ToolPairing,
} from '../../domain/run-settings.js';
import type { Variant } from '../../domain/variants.js';
import { paramsProblem } from '../../domain/raw-request.js';
import { DEFAULT_RUN_ENDPOINT, type RunEndpoint } from '../../domain/run-endpoint.js';
import { expiryProblem } from '../../domain/expiry.js';
import { answerBufferProblem } from '../../domain/answer-bytes.js';
import { qualityConfig, type QualityRequest } from '../../domain/quality.js';
import type { OutputFormat } from '../../domain/output-format.js';
import { lowerScheme } from '../../storage/location.js';
import { resolveInput } from './input-source.js';
import { giveBackOutput, insertOwningOutput, isOutputTaken, outputTaken, takeOutput } from './output-location.js';
import { describeStoreError } from '../../storage/index.js';

/** What a run is made of: the body of POST /v1/runs, as its route has validated it. */
export interface NewRun {
  name?: string;
  model: string;
  input: { file_id: string } | { uri: string } | { requests: unknown[] };
  params?: Record<string, unknown>;
  shard_size?: number;
  output?: { uri?: string; format?: OutputFormat; overwrite?: boolean; expires_after?: { seconds: number }; tokens?: boolean };
  split?: { eval: number };
  endpoint?: RunEndpoint;
  regenerate?: RegenerateMode | null;
  on_invalid_line?: OnInvalidLine;
  quality?: QualityRequest;
  priority?: number;
  metadata?: Record<string, string>;
  request_timeout_ms?: number;
  max_attempts?: number;
  webhook?: { url: string; secret: string };
  calibration?: { samples: number };
  dry_run?: boolean;
  deadline_seconds?: number;
  dispatch_order?: DispatchOrder;
  variants?: Variant[];
  on_length?: OnLength;
  tool_pairing?: ToolPairing;
  on_tool_mismatch?: ToolMismatchAction;
  history_reasoning?: HistoryReasoning;
}

/** The run's calibration slice; a dry run, which answers nothing else, must have one. */
export function checkCalibration(body: Pick<NewRun, 'calibration' | 'dry_run'>): number {
  const calibrationSamples = body.calibration?.samples ?? DEFAULT_CALIBRATION_SAMPLES;
  if (body.dry_run && calibrationSamples === 0) {
    throw new ApiError('validation_failed', 'calibration.samples: a dry run answers its calibration slice only, so the slice must not be 0', {
      field: 'calibration.samples',
    });
  }
  return calibrationSamples;
}

/**
 * A completions or embeddings run (`endpoint`): its lines are raw prompts or inputs, so what reads
 * chat messages (regenerate, the conversation formats) cannot apply, and an embedding is one vector.
 */
export function checkRawEndpoint(body: Pick<NewRun, 'endpoint' | 'regenerate' | 'output' | 'params' | 'split' | 'variants'>): void {
  const endpoint = body.endpoint ?? DEFAULT_RUN_ENDPOINT;
  if (endpoint === DEFAULT_RUN_ENDPOINT) return;
  const refuse = (field: string, why: string) => {
    throw new ApiError('validation_failed', `${field}: ${why} (the run's endpoint is "${endpoint}")`, { field });
  };
  if (body.regenerate) refuse('regenerate', 'regenerating assistant turns needs chat messages');
  if (body.output?.format === 'conversations')
    refuse('output.format', 'SpecForge\'s shape is a conversation; "jsonl" or "parquet" hold a raw prompt\'s or an input\'s output');
  if (body.output?.tokens) refuse('output.tokens', 'training rows are made from chat requests and their answers');
  if (endpoint === '/v1/embeddings' && typeof body.params?.n === 'number' && body.params.n > 1) refuse('params.n', 'an embedding has one answer');
  // The run's and each variant's params, as a line's own are checked: a wrong one would fail every request.
  for (const [at, params] of [['params.', body.params], ...(body.variants ?? []).map((v, i) => [`variants[${i}].params.`, v.params] as const)] as const) {
    const problem = paramsProblem(endpoint, params, at);
    if (problem) throw new ApiError('validation_failed', problem, { field: problem.slice(0, problem.indexOf(' ')).replace(/:$/, '') });
  }
}

/** An output lifetime (`output.expires_after`, a batch's `output_expires_after`) within OpenAI's bounds, or none. */
export function checkExpiry(seconds: number | undefined, field: string, min: number): void {
  const problem = seconds === undefined ? null : expiryProblem(seconds, min);
  if (problem) throw new ApiError('validation_failed', `${field}: ${problem}`, { field });
}

/** A run's params.n against its regenerate mode (samplesPerLineProblem); the mode is read as a string, whatever the route's enum lets through. */
export function checkSamplesPerLine(body: Pick<NewRun, 'params' | 'regenerate' | 'tool_pairing' | 'on_tool_mismatch' | 'history_reasoning'>): void {
  const problem = samplesPerLineProblem(body.params, body.regenerate as string | null | undefined);
  if (problem) throw new ApiError('validation_failed', problem, { field: 'params.n' });
  // The walk's settings mean something only where there is a walk: a run that sets one expects it read.
  for (const field of ['tool_pairing', 'on_tool_mismatch', 'history_reasoning'] as const) {
    if (body[field] !== undefined && body.regenerate !== 'all_assistant') {
      throw new ApiError('validation_failed', `${field} applies to regenerate: "all_assistant" only (the walk of a conversation's turns and tool-call steps)`, {
        field,
      });
    }
  }
}

/**
 * A run whose one answer can never fit the answer buffer (answerBufferProblem) would have it cut
 * on every try: refused here, by the run's params and each variant's over them.
 */
export function checkAnswerBuffer(body: Pick<NewRun, 'params' | 'variants'>, bufferBytes: number): void {
  const params = body.params ?? {};
  const layers = [
    { at: 'params', params },
    ...(body.variants ?? []).map((v, i) => ({ at: `variants[${i}].params`, params: layeredParams(params, v.params, null) })),
  ];
  for (const { at, params: p } of layers) {
    const problem = answerBufferProblem(p, bufferBytes);
    if (problem) throw new ApiError('validation_failed', `${at}.${problem.field}: ${problem.message}`, { field: `${at}.${problem.field}` });
  }
}

/** Checks that a run's input can be read: a stored file, or a URI inside the allowed roots; `name` is what a dry run is called after. */
export async function checkInput(deps: Deps, input: { file_id: string } | { uri: string }): Promise<{ input: RunInput; name: string }> {
  if ('file_id' in input) {
    const file = await getFile(deps.db, input.file_id);
    if (!file) {
      throw new ApiError('not_found', `input.file_id: file ${JSON.stringify(input.file_id.slice(0, 100))} does not exist`, { field: 'input.file_id' });
    }
    if (file.expiredAt !== null) {
      throw new ApiError('not_found', `input.file_id: file ${file.id} expired and its content was deleted`, { field: 'input.file_id' });
    }
    return { input: { file_id: file.id }, name: file.filename };
  }
  const uri = lowerScheme(input.uri);
  resolveInput(uri, deps.config);
  return { input: { uri }, name: uri.slice(uri.lastIndexOf('/') + 1) };
}

/**
 * Creates a run in `validating` and starts its ingestion. With an idempotency key, the same body
 * returns the run made the first time, and a different body is a conflict. `extra` sets columns
 * the body has no field for (a batch's), in the same insert, so ingestion never sees the run without them.
 */
export async function createRun(
  deps: Deps,
  body: NewRun,
  idempotencyKey?: string,
  extra: Partial<typeof runs.$inferInsert> = {},
): Promise<{ run: RunRow; replayed: boolean }> {
  const { db, config } = deps;
  const requestHash = createHash('sha256').update(JSON.stringify(body)).digest('hex');
  if (idempotencyKey) {
    const prior = await getRunByIdempotencyKey(db, idempotencyKey);
    if (prior) {
      if (prior.requestHash !== requestHash) {
        throw new ApiError('idempotency_conflict', 'this Idempotency-Key was used with a different request body');
      }
      return { run: prior, replayed: true };
    }
  }
  const calibrationSamples = checkCalibration(body);
  checkRawEndpoint(body);
  checkExpiry(body.output?.expires_after?.seconds, 'output.expires_after.seconds', config.minExpirySeconds);
  checkSamplesPerLine(body);
  checkAnswerBuffer(body, config.answerBufferBytes);
  const id = newId('run');
  const now = deps.clock();
  // The input is checked before the output's probe, and inline requests are stored after it, so
  // that a refused request stores nothing (a refused create gives back the folders its probe made).
  // A request with the same key that raced this one may have taken the prefix first: this one is its replay.
  const replays = async (err: unknown) =>
    idempotencyKey !== undefined &&
    (isUniqueViolation(err, 'idempotency_key') || isOutputTaken(err)) &&
    (await getRunByIdempotencyKey(db, idempotencyKey)) !== undefined;
  const checked = 'requests' in body.input ? undefined : await checkInput(deps, body.input);
  let output: Awaited<ReturnType<typeof takeOutput>>;
  try {
    output = await takeOutput(deps, id, body);
  } catch (err) {
    if (await replays(err)) return createRun(deps, body, idempotencyKey, extra);
    throw err;
  }
  let inlineFile: { id: string; objectKey: string } | undefined;
  try {
    let input: RunInput;
    // What a dry run without a name of its own is called after, so a list of runs tells plans apart.
    let inputName: string;
    if (!('requests' in body.input)) ({ input, name: inputName } = checked!);
    else {
      // Inline requests are kept as a file so a restart can validate them again.
      const fileId = newId('file');
      const key = `files/${fileId}.jsonl`;
      const text = body.input.requests.map((r) => JSON.stringify(r)).join('\n') + '\n';
      await deps.stores.forUri(config.outputUri).put(key, text);
      inlineFile = { id: fileId, objectKey: key };
      await insertFile(db, {
        id: fileId,
        filename: `${id}-requests.jsonl`,
        purpose: 'run_input',
        bytes: Buffer.byteLength(text),
        objectKey: key,
        createdAt: now,
      });
      input = { file_id: fileId };
      inputName = `${body.input.requests.length} inline requests`;
    }
    const row: typeof runs.$inferInsert = {
      id,
      name: body.name ?? (body.dry_run ? `dry run of ${inputName}` : null),
      model: body.model,
      status: 'validating',
      createdAt: now,
      params: body.params ?? {},
      input,
      shardSize: body.shard_size ?? config.shardSize,
      outputUri: output.uri,
      priority: body.priority ?? 0,
      metadata: body.metadata ?? {},
      regenerate: body.regenerate ?? null,
      endpoint: body.endpoint ?? null,
      outputExpiresAfter: body.output?.expires_after?.seconds ?? null,
      ...(body.regenerate === 'all_assistant' && {
        toolPairing: body.tool_pairing ?? 'name',
        onToolMismatch: body.on_tool_mismatch ?? 'truncate',
        historyReasoning: body.history_reasoning ?? 'loop',
      }),
      onInvalidLine: body.on_invalid_line ?? 'fail',
      quality: qualityConfig(body.quality, body.output?.tokens ?? false),
      requestTimeoutMs: body.request_timeout_ms ?? config.requestTimeoutMs,
      maxAttempts: body.max_attempts ?? config.maxAttempts,
      // A run without a webhook of its own takes the server's default URL; its secret stays in the config.
      webhookUrl: body.webhook?.url ?? config.webhookUrl ?? null,
      webhookSecret: body.webhook?.secret ?? null,
      idempotencyKey: idempotencyKey ?? null,
      requestHash,
      calibrationSamples,
      dryRun: body.dry_run ?? false,
      deadlineSeconds: body.deadline_seconds ?? null,
      // Length-aware by default for conversations only: their tail is the longest chain of turns, which
      // starting the longest conversations first shortens (`npm run bench conversations`, BENCHMARKS.md);
      // for single prompts the bench has not shown it shortening the tail.
      dispatchOrder: body.dispatch_order ?? (body.regenerate === 'all_assistant' ? 'length_aware' : 'input'),
      variants: body.variants ?? null,
      onLength: body.on_length ?? 'keep',
      outputFormat: body.output?.format ?? 'jsonl',
      evalShare: body.split?.eval ?? null,
      outputOverwrite: body.output?.overwrite ?? false,
      outputTokens: body.output?.tokens ?? false,
      updatedAt: now,
      ...extra,
    };
    await insertOwningOutput(deps, row, output, Boolean(body.output?.uri), (tx) => appendEvent(tx, id, 'status', { status: 'validating', reason: null }, now));
  } catch (err) {
    await giveBackOutput(deps, output).catch((e: unknown) =>
      deps.logger.warn({ err: { message: describeStoreError(e) } }, 'folders made by a refused probe not removed'),
    );
    if (inlineFile) {
      await deps.stores
        .forUri(config.outputUri)
        .delete(inlineFile.objectKey)
        .catch(() => {});
      await deleteFile(db, inlineFile.id);
    }
    // Two requests raced with one key: the loser answers with the winner's run.
    if (await replays(err)) return createRun(deps, body, idempotencyKey, extra);
    // Two requests raced for one output prefix: the loser is told whose it is.
    if (isUniqueViolation(err, 'output_uri')) throw outputTaken(await getRunOverlappingOutput(db, output.uri));
    throw err;
  }
  deps.logger.info({ run_id: id, model: body.model, status: 'validating' }, 'run created');
  // Read before validation starts: a short input can be queued before a read after it returns.
  const created = (await getRun(db, id))!;
  deps.startIngest(id);
  return { run: created, replayed: false };
}
