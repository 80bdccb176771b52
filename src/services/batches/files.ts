// A batch's output and error files are not stored: they are the run's shards, rewritten line by
// line into OpenAI's batch output format as they are read, one shard at a time.
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import type { Deps } from '../../deps.js';
import type { Db } from '../../db/client.js';
import { cancelledSamples, getRunByBatchFile, setBatchFileBytes, shardPage } from '../../db/batches.js';
import { getRun } from '../../db/runs.js';
import type { RunRow } from '../../db/schema.js';
import { fileObject } from '../../domain/files.js';
import { outputExpiresAt } from '../../domain/expiry.js';
import { batchLineError, readLines } from '../../domain/input-line.js';
import { type ErrorLine, isRawLine, type OutputLine, type RawOutputLine } from '../../domain/output-line.js';
import { BATCH_UNANSWERED } from '../../domain/sample-errors.js';
import { isTerminalRun } from '../../domain/statuses.js';
import { ApiError } from '../../errors.js';

type BatchFileKind = 'output' | 'error';

const SHARDS_PER_QUERY = 100;
const CHUNK_CHARS = 64 * 1024;
// Shard lines carry whole conversations; they were written by regen, so no input limit applies.
const MAX_SHARD_LINE_BYTES = 1 << 30;

/** The batch's file ids, each once the run is done and the file has at least one line. */
export function batchFileIds(r: RunRow): { output: string | null; error: string | null } {
  const done = isTerminalRun(r.status);
  return {
    output: done && r.completed > 0 ? r.outputFileId : null,
    error: done && r.failed + r.cancelled + r.invalidLines > 0 ? r.errorFileId : null,
  };
}

/** The run and kind behind a batch file id, when that file exists now. */
export async function resolveBatchFile(db: Db, fileId: string): Promise<{ run: RunRow; kind: BatchFileKind } | null> {
  const run = await getRunByBatchFile(db, fileId);
  if (!run) return null;
  const ids = batchFileIds(run);
  if (ids.output === fileId) return { run, kind: 'output' };
  if (ids.error === fileId) return { run, kind: 'error' };
  return null;
}

/** `batch_req_…`: stable for a request of a batch, so downloading the file twice gives the same bytes. */
function requestId(r: RunRow, key: string): string {
  return `batch_req_${createHash('sha256').update(`${r.batchId}\0${key}`).digest('hex').slice(0, 24)}`;
}

function outputRecord(r: RunRow, l: OutputLine | RawOutputLine): string {
  const id = requestId(r, l.custom_id);
  const u = l.usage;
  if (isRawLine(l)) {
    const body = rawResponseBody(r, l, id);
    return JSON.stringify({ id, custom_id: l.custom_id, response: { status_code: 200, request_id: l.response_id ?? id, body }, error: null });
  }
  return JSON.stringify({
    id,
    custom_id: l.custom_id,
    response: {
      status_code: 200,
      request_id: l.response_id ?? id,
      body: {
        id: l.response_id ?? `chatcmpl-${id.slice('batch_req_'.length)}`,
        object: 'chat.completion',
        created: l.created ?? Math.floor((r.finishedAt ?? r.createdAt) / 1000),
        model: l.model,
        choices: [
          {
            index: 0,
            // SGLang sends no refusals; OpenAI's schema wants the field, and a refusal list in logprobs, as null.
            message: { role: 'assistant', content: l.content, refusal: null, reasoning_content: l.reasoning_content },
            logprobs: l.logprobs ? { content: l.logprobs.content ?? null, refusal: l.logprobs.refusal ?? null } : null,
            finish_reason: l.finish_reason,
          },
          // A request that asked `n` in its body: its other choices, as OpenAI gives them in the one body.
          ...(l.choices ?? []).map((c) => ({
            index: c.index,
            message: { role: 'assistant', content: c.content, refusal: null, reasoning_content: c.reasoning_content },
            logprobs: c.logprobs ? { content: c.logprobs.content ?? null, refusal: c.logprobs.refusal ?? null } : null,
            finish_reason: c.finish_reason,
          })),
        ],
        usage: {
          prompt_tokens: u.prompt_tokens,
          completion_tokens: u.completion_tokens,
          total_tokens: u.prompt_tokens + u.completion_tokens,
          prompt_tokens_details: { cached_tokens: u.cached_tokens },
          completion_tokens_details: { reasoning_tokens: u.reasoning_tokens },
        },
        system_fingerprint: null,
      },
    },
    error: null,
  });
}

/** A completions or embeddings line as OpenAI's `text_completion` or embeddings `list`. */
function rawResponseBody(r: RunRow, l: RawOutputLine, id: string) {
  const u = l.usage;
  if (l.embedding !== undefined) {
    return {
      object: 'list',
      data: [{ object: 'embedding', index: 0, embedding: l.embedding }],
      model: l.model,
      usage: { prompt_tokens: u.prompt_tokens, total_tokens: u.prompt_tokens },
    };
  }
  const choice = (index: number, text: string | null, finish: string | null, logprobs: unknown) => ({
    index,
    text: text ?? '',
    logprobs: logprobs ?? null,
    finish_reason: finish,
  });
  return {
    id: l.response_id ?? `cmpl-${id.slice('batch_req_'.length)}`,
    object: 'text_completion',
    created: l.created ?? Math.floor((r.finishedAt ?? r.createdAt) / 1000),
    model: l.model,
    choices: [choice(0, l.text ?? null, l.finish_reason, l.logprobs), ...(l.choices ?? []).map((c) => choice(c.index, c.text, c.finish_reason, c.logprobs))],
    usage: { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens, total_tokens: u.prompt_tokens + u.completion_tokens },
  };
}

function errorRecord(r: RunRow, customId: string | null, key: string, error: { code: string; message: string; status: number | null }): string {
  const id = requestId(r, key);
  // A request the server refused keeps its HTTP answer, as OpenAI's error file does.
  const response =
    error.status === null
      ? null
      : {
          status_code: error.status,
          request_id: id,
          body: { error: { message: error.message, type: error.status >= 500 ? 'server_error' : 'invalid_request_error', param: null, code: error.code } },
        };
  return JSON.stringify({ id, custom_id: customId, response, error: { code: error.code, message: error.message } });
}

async function* shardLines(deps: Deps, r: RunRow, key: string): AsyncGenerator<string> {
  const source = await deps.stores.forUri(r.outputUri).getStream(key);
  for await (const raw of readLines(source, { maxLineBytes: MAX_SHARD_LINE_BYTES })) {
    if ('error' in raw) throw new Error(`${key} line ${raw.lineNo}: ${raw.error}`);
    if (raw.text !== '') yield raw.text;
  }
}

async function* outputRecords(deps: Deps, r: RunRow): AsyncGenerator<string> {
  for (let after = -1; ; ) {
    const page = await shardPage(deps.db, r.id, after, SHARDS_PER_QUERY);
    if (page.length === 0) return;
    for (const shard of page) {
      after = shard.idx;
      if (!shard.key || !shard.lines) continue;
      for await (const line of shardLines(deps, r, shard.key)) yield outputRecord(r, JSON.parse(line) as OutputLine | RawOutputLine);
    }
  }
}

async function* errorRecords(deps: Deps, r: RunRow): AsyncGenerator<string> {
  for (const e of r.lineErrors) {
    const { code, message } = batchLineError(e);
    yield errorRecord(r, e.custom_id ?? null, `line ${e.line}`, { code, message: `line ${e.line}: ${message}`, status: null });
  }
  const unanswered = { ...(r.expiredAt ? BATCH_UNANSWERED.expired : BATCH_UNANSWERED.cancelled), status: null };
  for (let after = -1; ; ) {
    const page = await shardPage(deps.db, r.id, after, SHARDS_PER_QUERY);
    if (page.length === 0) return;
    for (const shard of page) {
      after = shard.idx;
      if (shard.errorsKey) {
        for await (const line of shardLines(deps, r, shard.errorsKey)) {
          const l = JSON.parse(line) as ErrorLine;
          const error = { code: l.error.code ?? 'error', message: l.error.message ?? '', status: l.error.status };
          yield errorRecord(r, l.custom_id, l.custom_id, error);
        }
      }
      for (const s of await cancelledSamples(deps.db, r.id, shard)) yield errorRecord(r, s.customId, s.customId, unanswered);
    }
  }
}

/** The file's lines gathered into chunks of about CHUNK_CHARS, so a response is not a write per line. */
async function* batchFileChunks(deps: Deps, r: RunRow, kind: BatchFileKind): AsyncGenerator<string> {
  let chunk = '';
  for await (const record of kind === 'output' ? outputRecords(deps, r) : errorRecords(deps, r)) {
    chunk += record + '\n';
    if (chunk.length >= CHUNK_CHARS) {
      yield chunk;
      chunk = '';
    }
  }
  if (chunk) yield chunk;
}

export function batchFileStream(deps: Deps, r: RunRow, kind: BatchFileKind): Readable {
  return Readable.from(batchFileChunks(deps, r, kind));
}

/**
 * The file's size: read through once per finish of the run and remembered, since nothing but a
 * full pass can tell it (a retry reopens the run, and its next finish counts again).
 */
async function batchFileBytes(deps: Deps, r: RunRow, kind: BatchFileKind): Promise<number> {
  const at = r.finishedAt!;
  const known = r.batchFileBytes?.at === at ? r.batchFileBytes[kind] : undefined;
  if (known !== undefined) return known;
  let bytes = 0;
  try {
    for await (const chunk of batchFileChunks(deps, r, kind)) bytes += Buffer.byteLength(chunk);
  } catch (err) {
    deps.logger.error({ run_id: r.id, err: { message: (err as Error).message } }, 'batch file read failed');
    throw new ApiError('storage_unavailable', "the object store could not return the run's shards; try again");
  }
  const now = (await getRun(deps.db, r.id))?.batchFileBytes;
  const next = now?.at === at ? { ...now, [kind]: bytes } : { at, [kind]: bytes };
  await setBatchFileBytes(deps.db, r.id, at, next);
  return bytes;
}

/** The File object of a batch's output or error file. */
export async function renderBatchFile(deps: Deps, r: RunRow, kind: BatchFileKind) {
  // An expired file's shards are gone: its size is what was counted before, if it was.
  const expired = r.outputExpiredAt !== null;
  const bytes = expired ? (r.batchFileBytes?.at === r.finishedAt ? (r.batchFileBytes[kind] ?? 0) : 0) : await batchFileBytes(deps, r, kind);
  return fileObject({
    id: (kind === 'output' ? r.outputFileId : r.errorFileId)!,
    bytes,
    expiresAt: outputExpiresAt(r),
    expiredAt: r.outputExpiredAt,
    filename: `${r.batchId}_${kind}.jsonl`,
    purpose: 'batch_output',
    createdAt: r.finishedAt!,
  });
}
