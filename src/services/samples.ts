import { createHash } from 'node:crypto';
import type { Deps } from '../deps.js';
import type { RunRow, SampleRow } from '../db/schema.js';
import { getStagedOutput } from '../db/staging.js';
import type { StagedOutput } from '../domain/output-line.js';
import { answerOfRecord, type OutputFormat, parseStoredLine } from '../domain/output-format.js';
import { type RunEndpoint, runEndpoint } from '../domain/run-endpoint.js';
import { getShard, storedByShard } from '../db/shards.js';
import { idCount, stagedOutput } from '../domain/token-rows.js';
import { ApiError } from '../errors.js';
import { readParquetRows } from '../storage/parquet.js';

/** The Parquet columns that hold an answer, by the route a run's requests went to (an embedding's vector is no text to show). */
const ANSWER_COLUMNS: Record<RunEndpoint, string[]> = {
  '/v1/chat/completions': ['reasoning_content', 'content'],
  '/v1/completions': ['text'],
  '/v1/embeddings': [],
};

/** A sample's output: from staging while its shard is open, else the line of the uploaded shard. */
export async function readSampleOutput(
  deps: Pick<Deps, 'db' | 'stores' | 'logger'>,
  run: RunRow,
  s: SampleRow,
): Promise<{ reasoning_content: string | null; content: string | null } | null> {
  if (s.status !== 'completed') return null;
  const staged = await getStagedOutput(deps.db, s.id);
  if (staged) {
    const o = JSON.parse(staged) as StagedOutput;
    return { reasoning_content: o.reasoning_content, content: o.content };
  }
  // An expired output's shards are deleted: the sample is shown without its answer.
  if (!s.outputKey || !s.outputLine || run.outputExpiredAt !== null) return null;
  let bytes: Buffer;
  try {
    bytes = await deps.stores.forUri(run.outputUri).get(s.outputKey);
  } catch (err) {
    deps.logger.warn({ run_id: run.id, err: { message: (err as Error).message } }, 'shard read failed');
    throw new ApiError('storage_unavailable', 'the object store could not return this sample; try again');
  }
  const format = run.outputFormat as OutputFormat;
  let record: Record<string, unknown> | undefined;
  if (format === 'parquet') {
    // output_line is the sample's row, counted from 1 as lines are.
    try {
      [record] = await readParquetRows(bytes, { start: s.outputLine - 1, end: s.outputLine }, [
        'custom_id',
        'sample_index',
        ...ANSWER_COLUMNS[runEndpoint(run.endpoint)],
      ]);
    } catch {
      record = undefined;
    }
  } else {
    const line = bytes.toString('utf8').split('\n')[s.outputLine - 1];
    record = line ? parseStoredLine(format, line) : undefined;
  }
  if (!record) return null;
  const o = answerOfRecord(format, record);
  if (o.custom_id !== s.customId || o.sample_index !== s.sampleIndex) {
    deps.logger.warn({ run_id: run.id, key: s.outputKey }, 'shard line does not belong to the sample; the object was replaced');
    throw new ApiError('storage_unavailable', 'the stored shard no longer matches this run; its output cannot be shown');
  }
  return { reasoning_content: o.reasoning_content, content: o.content };
}

/**
 * A completed sample's trainable tokens in a run with output.tokens: the loss mask's 1s over its
 * training rows, staged or written (an answer whose ids did not come back, as a stream cut for
 * looping, has no row and counts 0); null otherwise, or once the output expired.
 */
export async function readTrainable(deps: Pick<Deps, 'db' | 'stores' | 'logger'>, run: RunRow, s: SampleRow): Promise<number | null> {
  if (!run.outputTokens || s.status !== 'completed') return null;
  const staged = await getStagedOutput(deps.db, s.id);
  if (staged) return ((JSON.parse(staged) as StagedOutput).tokens ?? []).reduce((n, g) => n + idCount(stagedOutput(g)), 0);
  if (run.outputExpiredAt !== null) return null;
  // A shard none of whose samples had ids writes no tokens file.
  const shard = await getShard(deps.db, run.id, s.shardIdx);
  if (!shard?.tokensKey) return 0;
  const format = run.outputFormat as OutputFormat;
  const unreadable = () => new ApiError('storage_unavailable', "the object store could not return this sample's training rows; try again");
  let bytes: Buffer;
  try {
    bytes = await deps.stores.forUri(run.outputUri).get(shard.tokensKey);
  } catch {
    throw unreadable();
  }
  // Only the file the shard wrote is read as its rows.
  if (!storedByShard(shard, shard.tokensSha256, shard.tokensKey, createHash('sha256').update(bytes).digest('hex'))) {
    deps.logger.warn({ run_id: run.id, key: shard.tokensKey }, 'tokens file does not match the shard written; the object was replaced');
    throw new ApiError('storage_unavailable', 'the stored training rows no longer match this run; they cannot be counted');
  }
  let rows: Record<string, unknown>[];
  try {
    rows = format === 'parquet' ? await readParquetRows(bytes, undefined, ['custom_id', 'sample_index', 'num_trainable']) : sampleLines(bytes, s);
  } catch {
    throw unreadable();
  }
  return rows.filter((r) => r.custom_id === s.customId && Number(r.sample_index) === s.sampleIndex).reduce((n, r) => n + Number(r.num_trainable), 0);
}

/**
 * A sample's lines of a JSONL tokens file, found in the bytes (each starts with its custom_id and
 * sample_index): a file of long id lists can be past the longest string V8 makes, so it is never
 * made one.
 */
function sampleLines(bytes: Buffer, s: Pick<SampleRow, 'customId' | 'sampleIndex'>): Record<string, unknown>[] {
  const start = Buffer.from(`${JSON.stringify({ custom_id: s.customId, sample_index: s.sampleIndex }).slice(0, -1)},`);
  const out: Record<string, unknown>[] = [];
  for (let at = bytes.indexOf(start); at !== -1; at = bytes.indexOf(start, at + 1)) {
    if (at > 0 && bytes[at - 1] !== NEWLINE) continue;
    const end = bytes.indexOf(NEWLINE, at);
    out.push(JSON.parse(bytes.toString('utf8', at, end === -1 ? bytes.length : end)) as Record<string, unknown>);
  }
  return out;
}

const NEWLINE = 0x0a;
