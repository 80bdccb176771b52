import type { Deps } from '../deps.js';
import type { RunRow, SampleRow } from '../db/schema.js';
import { getStagedOutput } from '../db/staging.js';
import type { StagedOutput } from '../domain/output-line.js';
import { ApiError } from '../errors.js';

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
  if (!s.outputKey || !s.outputLine) return null;
  let text: string;
  try {
    text = (await deps.stores.forUri(run.outputUri).get(s.outputKey)).toString('utf8');
  } catch (err) {
    deps.logger.warn({ run_id: run.id, err: { message: (err as Error).message } }, 'shard read failed');
    throw new ApiError('storage_unavailable', 'the object store could not return this sample; try again');
  }
  const line = text.split('\n')[s.outputLine - 1];
  if (!line) return null;
  const o = JSON.parse(line) as { custom_id: string; sample_index?: number; reasoning_content: string | null; content: string | null };
  if (o.custom_id !== s.customId || (o.sample_index ?? 0) !== s.sampleIndex) {
    deps.logger.warn({ run_id: run.id, key: s.outputKey }, 'shard line does not belong to the sample; the object was replaced');
    throw new ApiError('storage_unavailable', 'the stored shard no longer matches this run; its output cannot be shown');
  }
  return { reasoning_content: o.reasoning_content, content: o.content };
}
