// OpenAI's Batch API over runs: a batch is a run created from an uploaded file of batch lines,
// with a completion window after which its unanswered samples are given up (status `expired`).
import type { Readable } from 'node:stream';
import type { Deps } from '../../deps.js';
import type { DbOrTx } from '../../db/client.js';
import { servedModels } from '../../db/endpoints.js';
import { servesModel } from '../../domain/models.js';
import { getFile } from '../../db/files.js';
import type { FileRow, RunRow } from '../../db/schema.js';
import { parseInputLine, readLines } from '../../domain/input-line.js';
import { ApiError } from '../../errors.js';
import type { RunEndpoint } from '../../domain/run-endpoint.js';
import { newId } from '../../ids.js';
import { checkExpiry, createRun } from '../runs/create.js';

/** What a batch is made of: the body of POST /v1/batches, as its route has validated it. */
export interface NewBatch {
  input_file_id: string;
  endpoint: RunEndpoint;
  completion_window: string;
  output_expires_after?: { anchor: 'created_at'; seconds: number };
  metadata?: Record<string, string> | null;
  webhook?: { url: string; secret: string };
}

// The model is read from the first lines that name one; a file whose start names none is refused.
const PEEK_LINES = 100;

/**
 * Why no registered endpoint can serve `model`, or null when one does or may: an endpoint still
 * loading its weights has not said yet what it serves, and SGLang servers take minutes to start.
 */
export async function unservedModel(db: DbOrTx, model: string): Promise<string | null> {
  if ((await servedModels(db)).some((e) => e.model === null || servesModel(e.model, e.aliases, model))) return null;
  return `model ${JSON.stringify(model.slice(0, 100))} is not served by any registered endpoint`;
}

/** The model named by the first valid request of the file, which every other line must share. */
async function peekModel(deps: Deps, file: FileRow, endpoint: RunEndpoint): Promise<string> {
  let source: Readable;
  try {
    source = await deps.stores.forUri(deps.config.outputUri).getStream(file.objectKey);
  } catch (err) {
    deps.logger.error({ file_id: file.id, err: { message: (err as Error).message } }, 'batch input read failed');
    throw new ApiError('storage_unavailable', 'the object store could not return the input file; try again');
  }
  let model: string | null = null;
  try {
    for await (const raw of readLines(source, { maxLineBytes: deps.config.maxLineBytes })) {
      if ('text' in raw && raw.text.trim() !== '') {
        const parsed = parseInputLine(raw.text, raw.lineNo, { regenerate: null, choicesInBody: true, endpoint });
        if (parsed.ok && parsed.model) model = parsed.model;
      }
      if (model !== null || raw.lineNo >= PEEK_LINES) break;
    }
  } catch (err) {
    deps.logger.error({ file_id: file.id, err: { message: (err as Error).message } }, 'batch input read failed');
    throw new ApiError('storage_unavailable', 'the object store could not return the input file; try again');
  } finally {
    source.destroy();
  }
  if (model === null) {
    throw new ApiError(
      'validation_failed',
      `input_file_id: no valid request with a body.model in the file's first ${PEEK_LINES} lines; a batch runs the model its lines name`,
      { field: 'input_file_id' },
    );
  }
  if (model.length > 256)
    throw new ApiError('validation_failed', 'input_file_id: the lines name a model longer than 256 characters', { field: 'input_file_id' });
  return model;
}

const hours = (window: string) => Number(window.slice(0, -1));

/**
 * Creates the run behind a batch: the file's model, the run defaults (per-line `body` params
 * override them), invalid lines skipped and listed rather than failing the whole batch.
 */
export async function createBatch(deps: Deps, body: NewBatch): Promise<RunRow> {
  checkExpiry(body.output_expires_after?.seconds, 'output_expires_after.seconds', deps.config.minExpirySeconds);
  const file = await getFile(deps.db, body.input_file_id);
  if (!file) throw new ApiError('not_found', `file ${JSON.stringify(body.input_file_id.slice(0, 100))} does not exist`, { field: 'input_file_id' });
  if (file.expiredAt !== null) throw new ApiError('not_found', `file ${file.id} expired and its content was deleted`, { field: 'input_file_id' });
  const model = await peekModel(deps, file, body.endpoint);
  const batchId = newId('batch');
  const { run } = await createRun(
    deps,
    {
      name: batchId,
      model,
      endpoint: body.endpoint,
      input: { file_id: file.id },
      on_invalid_line: 'skip',
      metadata: body.metadata ?? {},
      webhook: body.webhook,
    },
    undefined,
    {
      batchId,
      completionWindow: body.completion_window,
      expiresAt: deps.clock() + hours(body.completion_window) * 3600_000,
      outputFileId: newId('file'),
      outputExpiresAfter: body.output_expires_after?.seconds ?? null,
      errorFileId: newId('file'),
    },
  );
  deps.logger.info({ run_id: run.id, batch_id: batchId, model }, 'batch created');
  return run;
}
