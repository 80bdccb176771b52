import type { RunnerDeps } from '../deps.js';
import type { Guard } from './guard.js';
import { setStatusReason } from '../db/runs.js';
import type { RunRow } from '../db/schema.js';
import { ANSWER_BUFFER_SETTING } from '../domain/answer-bytes.js';
import type { SampleError } from '../domain/sample-errors.js';
import { DISPATCHABLE_RUN_STATUSES } from '../domain/statuses.js';

// An answer cut to keep the memory budget of answers in flight (answer-budget.ts AnswerShed) gives
// its samples back with nothing charged: the largest answer in flight may well be a healthy one.
// But one cut every time it is asked would be asked for ever: a server that streams without end,
// or an answer larger than the whole budget. So the sheds of each sample are counted, and the
// MAX_SHEDS-th fails it; the run says so in its status_reason while its answers are being cut.

/** The shed that fails a sample: two are a busy moment, a third the same answer again. */
export const MAX_SHEDS = 3;

/** Starts the status_reason of a run whose answers are being cut. */
const SHED_PREFIX = `answers cut at ${ANSWER_BUFFER_SETTING}:`;

/** How long after its last shed a run's status_reason still says so. */
const SHED_REASON_MS = 30_000;

/**
 * The samples whose answers were shed, by this process: a sample given back may be asked by
 * another replica, which counts its own. A count goes when its sample settles any other way.
 */
export class AnswerSheds {
  private readonly bySample = new Map<number, number>();
  /** When each run last had an answer shed, while its status_reason says so. */
  private readonly lastShed = new Map<string, number>();

  constructor(
    private readonly deps: RunnerDeps,
    private readonly guard: Guard,
  ) {}

  /**
   * One answer to these samples was shed: logged and counted. Returns the error that fails them
   * when it was their MAX_SHEDS-th shed, else null (they are given back).
   */
  shed(run: RunRow, endpointId: string, sampleIds: readonly number[]): SampleError | null {
    const sheds = Math.max(...sampleIds.map((id) => (this.bySample.get(id) ?? 0) + 1));
    const failed = sheds >= MAX_SHEDS;
    for (const id of sampleIds) {
      if (failed) this.bySample.delete(id);
      else this.bySample.set(id, sheds);
    }
    const budget = this.deps.config.answerBufferBytes;
    this.deps.metrics.shed(failed);
    this.deps.logger.warn(
      { run_id: run.id, endpoint_id: endpointId, sample_ids: sampleIds, sheds, answer_buffer_bytes: budget },
      failed
        ? `an answer cut ${sheds} times to keep ${ANSWER_BUFFER_SETTING}: its samples fail`
        : `an answer cut to keep ${ANSWER_BUFFER_SETTING}: its samples go back`,
    );
    this.say(run, `${SHED_PREFIX} an answer outgrew the ${budget} bytes the answers in flight share; a sample cut ${MAX_SHEDS} times fails (answer_too_large)`);
    if (!failed) return null;
    return {
      code: 'answer_too_large',
      message: `the answer outgrew ${ANSWER_BUFFER_SETTING} (${budget} bytes, shared by the answers in flight): cut ${sheds} times, the longest answer in flight each time`,
      status: null,
    };
  }

  /** These samples settled otherwise (answered, failed, cancelled): their counts go. */
  settled(sampleIds: readonly number[]): void {
    for (const id of sampleIds) this.bySample.delete(id);
  }

  /** A run had an answer through uncut: its status_reason no longer speaks of sheds once the last is SHED_REASON_MS old. */
  answered(run: RunRow): void {
    const last = this.lastShed.get(run.id);
    if (last === undefined || this.deps.clock() - last < SHED_REASON_MS) return;
    this.lastShed.delete(run.id);
    if (run.statusReason?.startsWith(SHED_PREFIX)) this.say(run, null);
  }

  private say(run: RunRow, reason: string | null): void {
    if (reason) this.lastShed.set(run.id, this.deps.clock());
    // Another reason (a run waiting for an endpoint, a store outage) is left to its own writer.
    if (run.statusReason === reason || (run.statusReason && !run.statusReason.startsWith(SHED_PREFIX))) return;
    run.statusReason = reason;
    void this.guard('saying why answers are cut', () => setStatusReason(this.deps.db, run.id, reason, DISPATCHABLE_RUN_STATUSES));
  }
}
