import type { Db } from '../db/client.js';
import { applyOutcomes, type FlushReport, type Outcome } from '../db/results.js';
import type { Logger } from '../logger.js';
import { Coalesced } from './coalesced.js';

export type { FlushReport, Outcome } from '../db/results.js';
export type { Usage } from '../domain/output-line.js';

/** Results wait at most this long before they are committed (docs/design.md "Runner": about every 50 ms). */
const COMMIT_INTERVAL_MS = 50;
/** After a commit the database refused (another process holds its lock), the next try. */
const BUSY_RETRY_MS = 250;

/**
 * Commits outcomes in small batched transactions. Every update is guarded by status and lease
 * owner, so an outcome for a sample that is no longer ours (already terminal, reclaimed after a
 * restart) changes nothing and is counted as dropped. Commits never overlap: a flush asked for
 * while one runs follows it and takes everything queued by then.
 */
export class ResultWriter {
  private queue: Outcome[] = [];
  private timer: NodeJS.Timeout | null = null;
  private closed = false;
  private readonly commits = new Coalesced();

  constructor(
    private readonly db: Db,
    private readonly owner: string,
    private readonly logger: Logger,
    private readonly onFlush: (r: FlushReport) => void,
    private readonly clock: () => number,
    private readonly intervalMs = COMMIT_INTERVAL_MS,
  ) {}

  add(o: Outcome): void {
    // After close, an outcome is left to recovery: its sample is still leased and returns to the queue.
    if (this.closed) return;
    this.queue.push(o);
    this.timer ??= setTimeout(() => void this.flush(), this.intervalMs);
  }

  /** Commits what is queued one last time and takes no more: the database is about to close. */
  async close(): Promise<void> {
    await this.flush();
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /** Commits everything queued now; when the database refuses (SQLITE_BUSY, a lost connection) the batch stays queued and is tried again. */
  flush(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    return this.commits.run(() => this.commit());
  }

  private async commit(): Promise<void> {
    if (!this.queue.length) return;
    const batch = this.queue;
    this.queue = [];
    let report: FlushReport;
    try {
      report = await this.db.tx((tx) => applyOutcomes(tx, this.owner, batch, this.clock()));
    } catch (err) {
      this.logger.warn({ err: { message: (err as Error).message }, outcomes: batch.length }, 'result commit failed; retrying');
      this.queue = batch.concat(this.queue);
      if (!this.closed) this.timer ??= setTimeout(() => void this.flush(), BUSY_RETRY_MS);
      return;
    }
    this.onFlush(report);
  }
}
