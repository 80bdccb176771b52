import type { Db } from '../db/client.js';
import { prepareClaim, type ClaimedRow, type ClaimOrder } from '../db/samples.js';
import type { ResultWriter } from './results.js';

/** A sample leased for dispatch, with its run. */
export interface Claimed extends ClaimedRow {
  runId: string;
}

/**
 * A lease outlives any request (a run's request_timeout_ms is at most a day): leases are given
 * back by their owner or by recovery after a restart, never by expiry.
 */
const LEASE_MS = 24 * 3600_000;

/**
 * Samples claimed from the database and not yet sent, per run. A claim leases many samples in one
 * statement; they wait here, the slice first and then in the run's order, for free slots. States of a run's buffer: absent
 * (claim on the next take), holding samples, or drained this tick (nothing was due: do not ask
 * the database again until the next tick). Samples given back return to the queue through the
 * result writer, without spending an attempt.
 */
export class ClaimBuffer {
  private readonly buffers = new Map<string, Claimed[]>();
  private readonly drained = new Set<string>();
  private readonly claim: ReturnType<typeof prepareClaim>;

  constructor(
    db: Db,
    private readonly owner: string,
    private readonly clock: () => number,
    private readonly writer: ResultWriter,
  ) {
    this.claim = prepareClaim(db);
  }

  /** The run had nothing due at its last claim this tick. */
  isDrained(runId: string): boolean {
    return this.drained.has(runId);
  }

  /** A new tick: runs found drained may have samples due again (retries whose backoff ended). */
  newTick(): void {
    this.drained.clear();
  }

  /**
   * The next sample of a run: from its buffer, else from a claim of `claimSize()` samples (its
   * calibration slice first, then in `order`; see ClaimOrder). Null when the run has nothing due.
   * `onClaim` runs after a claim that found samples.
   */
  take(runId: string, claimSize: () => number, onClaim: () => void, order: ClaimOrder, window: number): Claimed | null {
    let buf = this.buffers.get(runId);
    if (!buf || buf.length === 0) {
      const now = this.clock();
      const rows = this.claim(runId, this.owner, now, now + LEASE_MS, claimSize(), order, window);
      if (rows.length === 0) {
        this.drained.add(runId);
        return null;
      }
      buf = rows.map((r) => ({ ...r, runId }));
      this.buffers.set(runId, buf);
      onClaim();
    }
    return buf.shift() ?? null;
  }

  /** Runs that hold claimed samples now. */
  runs(): IterableIterator<string> {
    return this.buffers.keys();
  }

  /** Gives a run's claimed samples back to the queue. */
  release(runId: string): void {
    const buf = this.buffers.get(runId);
    this.buffers.delete(runId);
    if (!buf) return;
    for (const s of buf) this.writer.add({ kind: 'release', sampleId: s.id, runId, shardIdx: s.shardIdx, endpointId: null });
  }

  /** Gives everything back and commits it now: the runner stops. */
  releaseAll(): void {
    for (const runId of [...this.buffers.keys()]) this.release(runId);
    this.writer.flush();
  }
}
