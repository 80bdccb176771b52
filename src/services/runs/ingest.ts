import { createReadStream } from 'node:fs';
import type { Readable } from 'node:stream';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { Deps } from '../../deps.js';
import { diskFullCode, isDbBusy, type Hold } from '../../db/client.js';
import { getFile } from '../../db/files.js';
import { getRun, getRunStatus, lockRun, setRunValidation, transitionRun } from '../../db/runs.js';
import { clearRunSamples, insertSampleBatch, markCalibration } from '../../db/samples.js';
import type { RunRow } from '../../db/schema.js';
import { insertShardLayout, insertSplitShardLayout, type SplitShard } from '../../db/shards.js';
import { pickSplit, type SplitName } from '../../domain/assign.js';
import { splitOfShardIdx, splitShardIdx } from '../../domain/output-format.js';
import { calibrationLines, CHARS_PER_TOKEN } from '../../domain/forecast.js';
import { layeredParams, regenerateMode, samplesPerLine } from '../../domain/run-settings.js';
import { runEndpoint } from '../../domain/run-endpoint.js';
import { parseInputLine, readLineBatches, type InvalidLine, type LineErrorCode } from '../../domain/input-line.js';
import { variantIndex } from '../../domain/variants.js';
import { answerBufferProblem } from '../../domain/answer-bytes.js';
import { insertRunVariants } from '../../db/run-variants.js';
import { unservedModel } from '../batches/create.js';
import { resolveInput } from './input-source.js';

// Small enough that a batch's rows are flushed before the young generation promotes them: at 5000
// the promoted garbage let the peak RSS grow by ~60 MB from a 100K- to a 300K-line input; at 1000
// it stays flat, at no cost in throughput (commits are cheap in WAL mode).
const BATCH = 1000;
const MAX_LISTED_ERRORS = 100;
/** Lines between full collections (see collectGarbage). */
const GC_LINES = 50_000;
/** Lines between looks at the run's status: one indexed read per batch, so a cancel is seen within milliseconds. */
const CANCEL_CHECK_LINES = BATCH;

/** Opens the run's input as a byte stream, wherever it lives. */
async function openInput(deps: Deps, run: RunRow): Promise<Readable> {
  const input = run.input;
  if ('file_id' in input) {
    const file = await getFile(deps.db, input.file_id);
    if (!file) throw new IngestError(`input file ${input.file_id} no longer exists`);
    return deps.stores.forUri(deps.config.outputUri).getStream(file.objectKey);
  }
  if ('uri' in input) {
    const src = resolveInput(input.uri, deps.config);
    if (src.kind === 'path') return createReadStream(src.path);
    return deps.stores.forUri(src.prefixUri).getStream(src.key);
  }
  throw new IngestError('run has no input');
}

class IngestError extends Error {}

/**
 * A split run's shards as ingestion fills them: each split takes its samples `shardSize` at a time,
 * in input order. A line placed but then refused as a duplicate leaves its shard one short, which
 * is why each shard's count and seq range come from the samples actually inserted.
 */
class SplitLayout {
  private readonly next = { train: 0, eval: 0 };
  private readonly byIdx = new Map<number, SplitShard>();

  constructor(
    private readonly evalShare: number,
    private readonly shardSize: number,
  ) {}

  /** A line's split, and the shard of each of its `perLine` samples (params.n) in that split's order. */
  place(customId: string, perLine: number): { split: SplitName; shardIdxs: number[] } {
    const split = pickSplit(customId, this.evalShare);
    const shardIdxs = Array.from({ length: perLine }, () => splitShardIdx(split, Math.floor(this.next[split]++ / this.shardSize)));
    return { split, shardIdxs };
  }

  placed(shardIdx: number, seq: number): void {
    const s = this.byIdx.get(shardIdx);
    if (s) {
      s.lastSeq = seq;
      s.sampleCount++;
    } else this.byIdx.set(shardIdx, { idx: shardIdx, split: splitOfShardIdx(shardIdx), firstSeq: seq, lastSeq: seq, sampleCount: 1 });
  }

  shards(): SplitShard[] {
    return [...this.byIdx.values()].sort((a, b) => a.idx - b.idx);
  }
}

let fullGc: (() => void) | undefined;
/**
 * JSON.parse interns short string values (up to 10 characters in V8): ids such as "s123456" go to
 * the string table and old space, where only a full collection frees them, and V8 does not count
 * the table towards the heap size that schedules one. A 1M-line input grew the peak RSS by ~50 MB
 * that way; a full collection every 50K lines (~20 ms each, ~3% of the time) keeps it flat. Taken
 * the way Jest takes it, switched off again so no other context sees `gc`.
 */
function collectGarbage(): void {
  if (!fullGc) {
    setFlagsFromString('--expose-gc');
    fullGc = runInNewContext('gc') as () => void;
    setFlagsFromString('--no-expose-gc');
  }
  fullGc();
}

/** Fails a run still validating, with the one log line of its status change. */
async function failValidation(deps: Deps, runId: string, reason: string, now: number): Promise<void> {
  if (await transitionRun(deps.db, runId, ['validating'], 'failed', now, { statusReason: reason })) {
    deps.logger.info({ run_id: runId, status: 'failed', reason }, 'run status');
  }
}

/**
 * Reads a run's input line by line, validates every line and inserts the samples in batched
 * transactions, then lays out the shards and queues the run. Memory stays bounded by the batch
 * size: duplicate ids are caught by the (run, custom_id) unique index, not by a set in memory.
 * Safe to run again after a crash: it starts by clearing what an earlier attempt inserted.
 */
export async function ingestRun(deps: Deps, runId: string, signal?: AbortSignal): Promise<void> {
  // One validator a run: on PostgreSQL another replica may be reading this input now. The hold ends
  // with its session, so a validator that dies leaves the run to the next one that asks.
  const hold = await deps.db.hold(`regen:ingest:${runId}`);
  if (!hold) {
    deps.logger.debug({ run_id: runId }, 'another process validates this run');
    return;
  }
  try {
    await ingestHeld(deps, runId, hold, signal);
  } finally {
    await hold.release();
  }
}

/**
 * The hold went with its connection: another replica may be validating this run now. Thrown as a
 * lost connection (SQLSTATE 08006), so the run is validated again, by whoever holds it next.
 */
function holdLost(): Error {
  return Object.assign(new Error('the hold on this validation was lost with its database connection'), { code: '08006' });
}

async function ingestHeld(deps: Deps, runId: string, hold: Hold, signal?: AbortSignal): Promise<void> {
  const { db, logger } = deps;
  const run = await getRun(db, runId);
  if (!run || run.status !== 'validating') return;
  await clearRunSamples(db, runId);

  const errors: InvalidLine[] = [];
  let invalid = 0;
  let seq = 0;
  let batch: {
    lineNo: number;
    customId: string;
    request: string;
    predicted: number | null;
    variant: number | null;
    split?: SplitName;
    shardIdxs?: readonly number[];
    turns: number | null;
  }[] = [];
  const layout = run.evalShare === null ? null : new SplitLayout(run.evalShare, run.shardSize);
  let predicted = 0;
  // Each variant's samples, counted as they are inserted (a duplicate is not).
  const variantTotals = (run.variants ?? []).map(() => 0);
  let turnsTotal = 0;
  let turnsMax = 0;
  const failFast = run.onInvalidLine === 'fail';
  // params.n: each line makes that many samples, at consecutive positions (`seq` counts samples).
  const perLine = samplesPerLine(run.params);
  // A batch takes its model from its lines, so a model no endpoint serves is an error of each line.
  const unserved = run.batchId ? await unservedModel(db, run.model) : null;

  // A line's own params over its variant's over the run's may ask an answer the answer buffer can never hold.
  const lineAnswerProblem = (customId: string, params: Record<string, unknown> | null): string | null => {
    if (!params) return null;
    const variant = variantIndex(customId, run.variants);
    const problem = answerBufferProblem(
      layeredParams(run.params, variant === null ? null : run.variants?.[variant]?.params, params),
      deps.config.answerBufferBytes,
    );
    return problem && `body.${problem.field}: ${problem.message}`;
  };
  const noteError = (line: number, code: LineErrorCode, message: string, customId?: string) => {
    invalid++;
    if (errors.length < MAX_LISTED_ERRORS) errors.push(customId ? { line, message, custom_id: customId, code } : { line, message, code });
  };
  /** Inserts the batch; false when the run left `validating` (a cancel), and nothing was inserted. */
  const flush = async (): Promise<boolean> => {
    const rows = batch;
    batch = [];
    // The run's row is locked with the check, so a cancel commits either before the batch (which then
    // inserts nothing) or after it (and the ingestion clears what it inserted): no batch lands unseen.
    const inserted = await db.tx(async (tx) => {
      if ((await lockRun(tx, runId))?.status !== 'validating') return null;
      if (hold.lost) throw holdLost();
      return await insertSampleBatch(
        tx,
        runId,
        seq,
        run.shardSize,
        rows.map((r) => ({
          customId: r.customId,
          request: r.request,
          predictedTokens: r.predicted,
          variant: r.variant,
          split: r.split,
          shardIdxs: r.shardIdxs,
          turn: r.turns === null ? null : 0,
        })),
        perLine,
      );
    });
    if (!inserted) return false;
    for (const [i, row] of rows.entries()) {
      if (!inserted[i]) noteError(row.lineNo, 'duplicate_custom_id', `duplicate custom_id ${JSON.stringify(row.customId)}`, row.customId);
      else {
        if (layout && row.shardIdxs) for (const [k, idx] of row.shardIdxs.entries()) layout.placed(idx, seq + k);
        seq += perLine;
        if (row.predicted !== null) predicted += perLine;
        if (row.variant !== null) variantTotals[row.variant] += perLine;
        turnsTotal += row.turns ?? 0;
        turnsMax = Math.max(turnsMax, row.turns ?? 0);
      }
    }
    return true;
  };
  const stopCancelled = async (source: { destroy(): void }) => {
    source.destroy();
    await clearRunSamples(db, runId);
  };

  try {
    const source = await openInput(deps, run);
    let lines = 0;
    // A chunk of lines at a time (domain/input-line.ts, readLineBatches).
    reading: for await (const chunk of readLineBatches(source, { maxLineBytes: deps.config.maxLineBytes })) {
      for (const raw of chunk) {
        if ('error' in raw) noteError(raw.lineNo, 'invalid_json_line', raw.error);
        else if (raw.text.trim() !== '') {
          const parsed = parseInputLine(raw.text, raw.lineNo, {
            regenerate: regenerateMode(run.regenerate),
            choicesInBody: run.batchId !== null,
            endpoint: runEndpoint(run.endpoint),
          });
          if (!parsed.ok) noteError(raw.lineNo, parsed.code, parsed.reason, parsed.custom_id);
          else if (parsed.model !== null && parsed.model !== run.model) {
            noteError(raw.lineNo, 'mismatched_model', `model ${JSON.stringify(parsed.model.slice(0, 100))} does not match the run's model`, parsed.custom_id);
          } else if (unserved) {
            noteError(raw.lineNo, 'model_not_found', unserved, parsed.custom_id);
          } else if (lineAnswerProblem(parsed.custom_id, parsed.params)) {
            noteError(raw.lineNo, 'invalid_request', lineAnswerProblem(parsed.custom_id, parsed.params)!, parsed.custom_id);
          } else {
            const request = JSON.stringify({
              ...(parsed.raw ?? { messages: parsed.messages }),
              ...(parsed.params && { params: parsed.params }),
              ...(parsed.exact_metadata ? { metadata_json: parsed.exact_metadata } : parsed.metadata && { metadata: parsed.metadata }),
              ...(parsed.numeric_id && { numeric_id: true }),
            });
            const old = parsed.old_answer_chars;
            batch.push({
              lineNo: raw.lineNo,
              customId: parsed.custom_id,
              request,
              predicted: old === null ? null : Math.round(old / CHARS_PER_TOKEN),
              variant: variantIndex(parsed.custom_id, run.variants),
              ...layout?.place(parsed.custom_id, perLine),
              turns: parsed.turns ?? null,
            });
          }
        }
        if (failFast && invalid > 0) {
          if (errors.length >= MAX_LISTED_ERRORS) break reading;
          batch = [];
        }
        if (batch.length >= BATCH && !(await flush())) return await stopCancelled(source);
        if (signal?.aborted) {
          // Shutdown: the run stays `validating` and is validated again from the start on the next boot;
          // one cancelled meanwhile is not, so what was inserted for it goes now.
          source.destroy();
          logger.info({ run_id: runId }, 'validation stopped by shutdown');
          if ((await getRunStatus(db, runId)) !== 'validating') await clearRunSamples(db, runId);
          return;
        }
        if (++lines % GC_LINES === 0) {
          collectGarbage();
          await new Promise((r) => setImmediate(r));
        }
        // A cancel stops a long validation within a batch of lines, so its samples never linger.
        if (lines % CANCEL_CHECK_LINES === 0 && (await getRunStatus(db, runId)) !== 'validating') return await stopCancelled(source);
      }
    }
    if (!(failFast && invalid > 0) && !(await flush())) return await stopCancelled(source);
  } catch (err) {
    if (!db.open) {
      // The server closed the database while this run was validating; it starts over on the next boot.
      logger.info({ run_id: runId }, 'validation stopped by shutdown');
      return;
    }
    // Not the input's fault: the run is validated again once the database takes writes, or the disk has room (see server.ts).
    if (isDbBusy(err) || diskFullCode(err)) throw err;
    const message = err instanceof IngestError ? err.message : 'the input could not be read';
    logger.warn({ run_id: runId, err: { message: (err as Error).message } }, 'input read failed');
    await clearRunSamples(db, runId);
    await failValidation(deps, runId, message, deps.clock());
    return;
  }

  const now = deps.clock();
  // Duplicates are found when a batch is inserted, after later lines' parse errors: list by line.
  errors.sort((a, b) => a.line - b.line);
  const listed = { invalidLines: invalid, lineErrors: errors, updatedAt: now };
  if (failFast && invalid > 0) {
    await clearRunSamples(db, runId);
    await setRunValidation(db, runId, listed);
    const first = errors[0];
    // A batch has no such setting (OpenAI's API has none): only a run's reason offers it.
    const fix = run.batchId ? '' : `; to run without them, create the run with on_invalid_line: "skip" (regen submit --on-invalid-line skip)`;
    await failValidation(
      deps,
      runId,
      `input has ${invalid}${errors.length >= MAX_LISTED_ERRORS ? '+' : ''} invalid line(s); first: line ${first.line}: ${first.message}${fix}`,
      now,
    );
    return;
  }
  if (seq === 0) {
    await setRunValidation(db, runId, listed);
    await failValidation(deps, runId, 'input has no valid lines', now);
    return;
  }
  // One transaction, the run's row locked first: the status check and the queueing are one step, so
  // a cancel that landed while the input was read leaves neither shards nor counters behind.
  let shardCount = 0;
  const queued = await db.tx(async (tx) => {
    if ((await lockRun(tx, runId))?.status !== 'validating') return false;
    if (hold.lost) throw holdLost();
    shardCount = layout ? await insertSplitShardLayout(tx, runId, layout.shards()) : await insertShardLayout(tx, runId, run.shardSize, seq);
    await markCalibration(tx, runId, calibrationLines(runId, seq, run.calibrationSamples, perLine));
    await insertRunVariants(tx, runId, variantTotals);
    await setRunValidation(tx, runId, { ...listed, total: seq, pending: seq, shardsTotal: shardCount, predictedSamples: predicted, turnsTotal, turnsMax });
    return await transitionRun(tx, runId, ['validating'], 'queued', now, {
      statusReason: invalid ? `${invalid} invalid line(s) skipped` : null,
    });
  });
  if (queued) {
    logger.info({ run_id: runId, status: 'queued', samples: seq, shards: shardCount, invalid_lines: invalid }, 'run validated');
  } else {
    await clearRunSamples(db, runId);
  }
  deps.runner.wake();
}
