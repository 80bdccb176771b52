import { statusTimes, type StatusTimes } from '../../db/batches.js';
import type { Db } from '../../db/client.js';
import type { RunRow } from '../../db/schema.js';
import { batchLineError } from '../../domain/input-line.js';
import { runEndpoint } from '../../domain/run-endpoint.js';
import { gateTripped } from '../../domain/quality.js';
import { batchFileIds } from '../../services/batches/files.js';
import type { Batch } from './schemas.js';

const seconds = (ms: number | null | undefined) => (ms == null ? null : Math.floor(ms / 1000));

/** The run's status in OpenAI's words (README "OpenAI Batch API" has the table). */
function batchStatus(r: RunRow): Batch['status'] {
  switch (r.status) {
    case 'validating':
      return 'validating';
    case 'queued':
    case 'in_progress':
    case 'paused':
      return 'in_progress';
    case 'finalizing':
      return 'finalizing';
    case 'completed':
      return 'completed';
    case 'failed':
      return 'failed';
    // An expiring run is cancelled underneath; the batch only reads `expired` once its files are ready.
    case 'cancelling':
      return r.expiredAt ? 'finalizing' : 'cancelling';
    default:
      return r.expiredAt ? 'expired' : 'cancelled';
  }
}

function batchErrors(r: RunRow): Batch['errors'] {
  const data: NonNullable<Batch['errors']>['data'] = r.lineErrors.map(batchLineError);
  if (r.invalidLines > r.lineErrors.length) {
    data.push({ code: 'too_many_errors', line: null, message: `${r.invalidLines - r.lineErrors.length} more invalid line(s) not listed`, param: null });
  }
  if (gateTripped(r)) {
    const resume = `POST /v1/runs/${r.id}/resume {"override_gate": true} continues it`;
    data.push({ code: 'quality_gate', line: null, message: `${r.statusReason}; run ${r.id} is paused: ${resume}`, param: null });
  }
  if (r.status === 'failed' && r.lineErrors.length === 0) {
    data.push({ code: 'failed', line: null, message: r.statusReason ?? 'the batch failed', param: null });
  }
  return data.length ? { object: 'list', data } : null;
}

function renderBatch(r: RunRow, times: StatusTimes | undefined): Batch {
  const status = batchStatus(r);
  const last = (s: string) => seconds(times?.last.get(s));
  // Processing began when validation ended: the run's first queued (or in_progress) moment.
  const began = [times?.first.get('queued'), times?.first.get('in_progress')].filter((t): t is number => t !== undefined);
  const files = batchFileIds(r);
  const done = status === 'completed' || status === 'failed' || status === 'cancelled' || status === 'expired';
  return {
    id: r.batchId!,
    object: 'batch',
    endpoint: runEndpoint(r.endpoint),
    model: r.model,
    errors: batchErrors(r),
    input_file_id: 'file_id' in r.input ? r.input.file_id : '',
    completion_window: r.completionWindow ?? '24h',
    status,
    output_file_id: files.output,
    error_file_id: files.error,
    created_at: seconds(r.createdAt)!,
    in_progress_at: began.length ? seconds(Math.min(...began)) : null,
    expires_at: seconds(r.expiresAt),
    finalizing_at: last('finalizing'),
    completed_at: status === 'completed' ? last('completed') : null,
    failed_at: status === 'failed' ? last('failed') : null,
    expired_at: seconds(r.expiredAt),
    cancelling_at: r.expiredAt ? null : last('cancelling'),
    cancelled_at: status === 'cancelled' ? last('cancelled') : null,
    request_counts: {
      total: r.total + r.invalidLines,
      completed: r.completed,
      // Once the batch is over every request is in one file or the other: the error file lists
      // invalid lines, failed samples and the samples cancellation or expiry left unanswered.
      failed: r.failed + r.invalidLines + (done ? r.cancelled : 0),
    },
    usage: {
      input_tokens: r.promptTokens,
      input_tokens_details: { cached_tokens: r.cachedTokens },
      output_tokens: r.completionTokens,
      output_tokens_details: { reasoning_tokens: r.reasoningTokens },
      total_tokens: r.promptTokens + r.completionTokens,
    },
    metadata: r.metadata,
  };
}

/** Batches for these runs, with their status times read in one query. */
export async function renderBatches(db: Db, rows: RunRow[]): Promise<Batch[]> {
  const times = await statusTimes(
    db,
    rows.map((r) => r.id),
  );
  return rows.map((r) => renderBatch(r, times.get(r.id)));
}
