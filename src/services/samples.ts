import type { Deps } from '../deps.js';
import type { RunRow, SampleRow } from '../db/schema.js';
import { getStagedOutput } from '../db/staging.js';
import type { StagedOutput } from '../domain/output-line.js';
import { answerOfRecord, type OutputFormat, parseStoredLine } from '../domain/output-format.js';
import { type RunEndpoint, runEndpoint } from '../domain/run-endpoint.js';
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
