import { fileURLToPath } from 'node:url';
import { createHash } from 'node:crypto';
import type { Deps } from '../../deps.js';
import { isUniqueViolation } from '../../db/client.js';
import { ApiError } from '../../errors.js';
import { newId } from '../../ids.js';
import { appendEvent } from '../../db/events.js';
import { deleteFile, getFile, insertFile } from '../../db/files.js';
import { getRun, getRunByIdempotencyKey, getRunByOutputUri, insertRun } from '../../db/runs.js';
import type { runs, RunInput, RunRow } from '../../db/schema.js';
import { DEFAULT_CALIBRATION_SAMPLES } from '../../domain/forecast.js';
import type { DispatchOrder, OnInvalidLine, RegenerateMode } from '../../domain/params.js';
import { qualityConfig, type QualityRequest } from '../../domain/quality.js';
import { parseStoreUri, StoreUriError } from '../../storage/index.js';
import { inside, resolveInput } from './input-source.js';

/** What a run is made of: the body of POST /v1/runs, as its route has validated it. */
export interface NewRun {
  name?: string;
  model: string;
  input: { file_id: string } | { uri: string } | { requests: unknown[] };
  params?: Record<string, unknown>;
  shard_size?: number;
  output?: { uri: string };
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
}

/** An S3 object key is at most 1,024 bytes; the output prefix's unique index holds it whole. */
const MAX_OUTPUT_URI_BYTES = 1024;

async function outputUriFor(deps: Deps, runId: string, requested?: string): Promise<string> {
  if (!requested) return `${deps.config.outputUri}runs/${runId}/`;
  const uri = requested.endsWith('/') ? requested : requested + '/';
  if (Buffer.byteLength(requested) > MAX_OUTPUT_URI_BYTES) {
    throw new ApiError('validation_failed', `output.uri: at most ${MAX_OUTPUT_URI_BYTES} bytes in UTF-8`, { field: 'output.uri' });
  }
  try {
    parseStoreUri(uri);
  } catch (err) {
    const why = err instanceof StoreUriError ? err.message : 'not a valid output URI';
    throw new ApiError('validation_failed', `output.uri: ${why}`, { field: 'output.uri' });
  }
  if (uri.startsWith('file:')) {
    // A local output folder is held to the same roots as local inputs.
    const path = fileURLToPath(uri);
    if (![deps.config.dataDir, ...deps.config.inputRoots].some((root) => inside(path, root))) {
      throw new ApiError('validation_failed', 'output.uri: file:// outputs must lie inside the data folder or REGEN_INPUT_ROOTS', {
        field: 'output.uri',
      });
    }
  }
  // Two runs writing shard-00000.jsonl and manifest.json to one prefix would overwrite each other.
  // Checked here for a clear answer before anything is stored; the unique index decides a race.
  const owner = await getRunByOutputUri(deps.db, uri);
  if (owner) throw outputTaken(owner.id);
  return uri;
}

const isOutputTaken = (err: unknown): boolean =>
  isUniqueViolation(err, 'output_uri') || (err instanceof ApiError && err.code === 'conflict' && err.extra.field === 'output.uri');

function outputTaken(runId: string | undefined): ApiError {
  const whose = runId ? `run ${runId}` : 'another run';
  return new ApiError('conflict', `output.uri is already the output of ${whose}; give each run its own prefix`, { field: 'output.uri' });
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
  const calibrationSamples = body.calibration?.samples ?? DEFAULT_CALIBRATION_SAMPLES;
  if (body.dry_run && calibrationSamples === 0) {
    throw new ApiError('validation_failed', 'calibration.samples: a dry run answers its calibration slice only, so the slice must not be 0', {
      field: 'calibration.samples',
    });
  }
  const id = newId('run');
  const now = deps.clock();
  // Checked before anything is stored, so a refused request leaves nothing behind.
  // A request with the same key that raced this one may have taken the prefix first: this one is its replay.
  const replays = async (err: unknown) =>
    idempotencyKey !== undefined &&
    (isUniqueViolation(err, 'idempotency_key') || isOutputTaken(err)) &&
    (await getRunByIdempotencyKey(db, idempotencyKey)) !== undefined;
  let outputUri: string;
  try {
    outputUri = await outputUriFor(deps, id, body.output?.uri);
  } catch (err) {
    if (await replays(err)) return createRun(deps, body, idempotencyKey, extra);
    throw err;
  }
  let input: RunInput;
  // What a dry run without a name of its own is called after, so a list of runs tells plans apart.
  let inputName: string;
  let inlineFile: { id: string; objectKey: string } | undefined;
  if ('file_id' in body.input) {
    const file = await getFile(db, body.input.file_id);
    if (!file) {
      throw new ApiError('not_found', `input.file_id: file ${JSON.stringify(body.input.file_id.slice(0, 100))} does not exist`, { field: 'input.file_id' });
    }
    input = { file_id: file.id };
    inputName = file.filename;
  } else if ('uri' in body.input) {
    resolveInput(body.input.uri, config);
    input = { uri: body.input.uri };
    inputName = body.input.uri.slice(body.input.uri.lastIndexOf('/') + 1);
  } else {
    // Inline requests are kept as a file so a restart can validate them again.
    const fileId = newId('file');
    const key = `files/${fileId}.jsonl`;
    const text = body.input.requests.map((r) => JSON.stringify(r)).join('\n') + '\n';
    await deps.stores.forUri(config.outputUri).put(key, text);
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
    inlineFile = { id: fileId, objectKey: key };
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
    outputUri,
    priority: body.priority ?? 0,
    metadata: body.metadata ?? {},
    regenerate: body.regenerate ?? null,
    onInvalidLine: body.on_invalid_line ?? 'fail',
    quality: qualityConfig(body.quality),
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
    // Opt-in: the bench (BENCHMARKS.md) has not shown length-aware order shortening the tail yet.
    dispatchOrder: body.dispatch_order ?? 'input',
    updatedAt: now,
    ...extra,
  };
  try {
    await db.tx(async (tx) => {
      await insertRun(tx, row);
      await appendEvent(tx, id, 'status', { status: 'validating', reason: null }, now);
    });
  } catch (err) {
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
    if (isUniqueViolation(err, 'output_uri')) throw outputTaken((await getRunByOutputUri(db, outputUri))?.id);
    throw err;
  }
  deps.logger.info({ run_id: id, model: body.model, status: 'validating' }, 'run created');
  // Read before validation starts: a short input can be queued before a read after it returns.
  const created = (await getRun(db, id))!;
  deps.startIngest(id);
  return { run: created, replayed: false };
}
