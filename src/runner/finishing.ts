import type { RunnerDeps } from '../deps.js';
import { getRun, setStatusReason, transitionRun } from '../db/runs.js';
import { cancelPendingSamples } from '../db/samples.js';
import type { RunRow, ShardRow } from '../db/schema.js';
import { closedOpenShards, listRunShards, recordUploadFailure } from '../db/shards.js';
import { ACTIVE_RUN_STATUSES, isTerminalRun, type RunStatus } from '../domain/statuses.js';
import { endStatusReason } from '../domain/quality.js';
import { describeStoreError, FolderChangedError } from '../storage/index.js';
import { backoffMs, storeBackoff } from '../domain/backoff.js';
import { Coalesced } from './coalesced.js';
import { outputStore, uploadShard, writeManifest } from './shard-writer.js';

/** Shard uploads under way at once: enough to hide the store's latency, few enough not to flood it. */
const MAX_CONCURRENT_UPLOADS = 4;
/** Closed shards looked at per run and pass; the next pass takes the rest. */
const SHARDS_PER_PASS = 8;
/** A failed manifest write waits this long: not on every tick, or a store that is down gets ten writes a second. */
const MANIFEST_RETRY_MS = 2000;
/** Failed attempts at one shard after which the run says why it is not done (a store that blinked fails once or twice). */
const UPLOAD_ATTEMPTS_BEFORE_REASON = 3;
/** Failed attempts after which the run fails: with the default backoff, about five minutes of a store refusing writes. */
const UPLOAD_ATTEMPTS_BEFORE_FAILING = 10;
/** A running run whose shards cannot be written fails; a cancelling one is cancelled all the same (pass()). */
const FAILABLE: readonly RunStatus[] = ['queued', 'in_progress', 'paused', 'finalizing'];
const UPLOAD_REASON = 'shard uploads failing';

/**
 * The end of a run's samples: cancels what is left of cancelling runs, uploads each shard once all
 * its samples are terminal, moves a settled run to finalizing, and once every shard is uploaded
 * writes the manifest and ends the run (completed or cancelled).
 */
export class Finisher {
  private readonly uploading = new Set<string>();
  /**
   * When a shard (or a run's manifest) may be tried again, and after how many failed uploads. A
   * backoff two or more attempts ahead of the shard's row is from before a retry reset them, and
   * no longer holds (an upload under way when its run failed can leave one behind); one ahead is
   * a row read before the failure was recorded.
   */
  private readonly retryAt = new Map<string, { at: number; attempts: number }>();
  private readonly finishing = new Set<string>();

  constructor(
    private readonly deps: RunnerDeps,
    private readonly guard: <T>(what: string, step: () => T) => T | undefined,
    private readonly hooks: { afterUpload(): unknown; settled(run: RunRow): Promise<unknown>; afterFinish(runId: string): void },
  ) {}

  /** Removes an ended run's temp folder: a finished output folder holds only what its manifest lists. */
  async removeTemp(run: RunRow): Promise<void> {
    await outputStore(this.deps, run).removeTemp();
  }

  /** Shard uploads or manifest writes still under way. */
  get busy(): number {
    return this.uploading.size;
  }

  private readonly passes = new Coalesced();

  /** One pass over the active runs; passes never overlap (one asked for meanwhile follows). */
  advance(active: readonly RunRow[]): Promise<void> {
    return this.passes.run(() => this.pass(active));
  }

  private async pass(active: readonly RunRow[]): Promise<void> {
    const { db, clock, logger } = this.deps;
    for (const run of active) {
      if (run.status === 'cancelling') await cancelPendingSamples(db, run.id);
      const fresh = await getRun(db, run.id);
      if (!fresh) continue;
      for (const shard of await closedOpenShards(db, run.id, SHARDS_PER_PASS)) this.upload(fresh, shard);
      const settled = fresh.pending === 0 && fresh.inProgress === 0 && fresh.total > 0;
      if (!settled) continue;
      if (fresh.status === 'in_progress' || fresh.status === 'queued') {
        await this.hooks.settled(fresh);
        if (await transitionRun(db, run.id, [fresh.status], 'finalizing', clock())) logger.info({ run_id: run.id, status: 'finalizing' }, 'run status');
      }
      if (fresh.shardsUploaded === fresh.shardsTotal && (fresh.status === 'finalizing' || fresh.status === 'cancelling' || fresh.status === 'in_progress')) {
        await this.finish(run.id);
      } else if (fresh.status === 'cancelling') await this.cancelUnwritten(fresh);
    }
  }

  /**
   * Drops the run's backoffs: once the store answers again, and once the run has ended, since a
   * retry gives its shards a fresh upload budget and must not wait out the attempts before it.
   */
  forget(runId: string): void {
    for (const k of this.retryAt.keys()) if (k.startsWith(`${runId}\0`)) this.retryAt.delete(k);
  }

  private key(runId: string, what: number | 'manifest'): string {
    return `${runId}\0${what}`;
  }

  private waiting(key: string, attempts = 0): boolean {
    const backoff = this.retryAt.get(key);
    return backoff !== undefined && backoff.attempts <= attempts + 1 && backoff.at > this.deps.clock();
  }

  private upload(run: RunRow, shard: ShardRow): void {
    const key = this.key(run.id, shard.idx);
    if (this.uploading.has(key) || this.waiting(key, shard.uploadAttempts) || this.uploading.size >= MAX_CONCURRENT_UPLOADS) return;
    const { deps } = this;
    this.uploading.add(key);
    uploadShard(deps, run, shard)
      .then(async (done) => {
        this.retryAt.delete(key);
        if (!done) return;
        if (shard.uploadAttempts >= UPLOAD_ATTEMPTS_BEFORE_REASON) await this.clearUploadReason(run.id);
        // The store answers again: the run's other shards waiting out a backoff need not wait longer.
        this.forget(run.id);
        deps.metrics.shardUploaded();
        // Outside the upload's own error path: a fault here must not be taken for a failed upload.
        setImmediate(() => void this.guard('advancing runs', () => this.hooks.afterUpload()));
      })
      .catch((err: Error) => {
        deps.metrics.shardUploadFailed();
        const attempts = shard.uploadAttempts + 1;
        const delayMs = backoffMs(attempts, storeBackoff(deps.config.storeRetryMs));
        this.retryAt.set(key, { at: deps.clock() + delayMs, attempts });
        const why = describeStoreError(err);
        const lastError = `upload failed: ${why}; retrying in ${Math.round(delayMs / 1000)} s`;
        deps.logger.warn({ run_id: run.id, shard: shard.idx, attempts, err: { message: err.message } }, 'shard upload failed');
        return this.guard('recording a failed shard upload', async () => {
          if (!(await recordUploadFailure(deps.db, run.id, shard.idx, shard.uploadAttempts, lastError))) return;
          if (err instanceof FolderChangedError) await this.folderChanged(run.id, `shard ${shard.idx}`);
          else await this.escalate(run.id, shard.idx, attempts, why);
        });
      })
      .finally(() => this.uploading.delete(key));
  }

  /**
   * A shard that keeps failing: the run says so after a few attempts, and fails after more, its
   * completed samples' rows kept so that a retry writes them once the store is fixed.
   */
  private async escalate(runId: string, idx: number, attempts: number, why: string): Promise<void> {
    const { db, clock, logger } = this.deps;
    if (attempts >= UPLOAD_ATTEMPTS_BEFORE_FAILING) {
      const reason = `shard ${idx} could not be written after ${attempts} attempts: ${why}; retry the run once the output location takes writes`;
      if (await transitionRun(db, runId, FAILABLE, 'failed', clock(), { statusReason: reason })) {
        // At once, not when the runner next sees the run gone: a retry may come first.
        this.forget(runId);
        logger.error({ run_id: runId, status: 'failed', shard: idx, reason }, 'run status');
      }
    } else if (attempts >= UPLOAD_ATTEMPTS_BEFORE_REASON) {
      await setStatusReason(db, runId, `${UPLOAD_REASON}: shard ${idx} failed ${attempts} times (${why}); retrying`, FAILABLE);
    }
  }

  /**
   * The run's local folder is no longer the one it took: no attempt will find it again, and writing
   * where its path now leads would fill another folder. The run ends at once with the reason (a
   * cancelling one cancelled, without its manifest); a retry once the folder is back writes the rest.
   */
  private async folderChanged(runId: string, what: string): Promise<void> {
    const { db, clock, logger } = this.deps;
    const reason = `${what} was not written: ${describeStoreError(new FolderChangedError())}; put the folder back and retry the run`;
    for (const [from, to] of [
      [FAILABLE, 'failed'],
      [['cancelling'], 'cancelled'],
    ] as const) {
      if (await transitionRun(db, runId, from, to, clock(), { statusReason: reason })) {
        this.forget(runId);
        logger.error({ run_id: runId, status: to, reason }, 'run status');
        this.hooks.afterFinish(runId);
        return;
      }
    }
  }

  private async clearUploadReason(runId: string): Promise<void> {
    const run = await getRun(this.deps.db, runId);
    if (run?.statusReason?.startsWith(UPLOAD_REASON)) await setStatusReason(this.deps.db, runId, null, ACTIVE_RUN_STATUSES);
  }

  /**
   * Cancel wins over a store that refuses writes: once every shard left unwritten has been tried
   * and failed, the run is cancelled with the reason, rather than left cancelling until the store
   * comes back. A restart tries each such shard once more, then ends the run the same way.
   */
  private async cancelUnwritten(run: RunRow): Promise<void> {
    const unwritten = (await listRunShards(this.deps.db, run.id)).filter((s) => s.status !== 'uploaded');
    if (unwritten.length === 0 || unwritten.some((s) => s.uploadAttempts === 0 || this.uploading.has(this.key(run.id, s.idx)))) return;
    const why = (unwritten[0].lastError ?? 'upload failed').replace(/; retrying.*$/, '');
    // No manifest: it lists what counts, and these shards' samples are in the database only.
    const reason = `cancelled with ${unwritten.length} of ${run.shardsTotal} shards not written: ${why}`;
    if (await transitionRun(this.deps.db, run.id, ['cancelling'], 'cancelled', this.deps.clock(), { statusReason: reason })) {
      this.deps.logger.warn({ run_id: run.id, status: 'cancelled', reason }, 'run status');
      this.hooks.afterFinish(run.id);
    }
  }

  private async finish(runId: string): Promise<void> {
    const retryKey = this.key(runId, 'manifest');
    if (this.finishing.has(runId) || this.waiting(retryKey)) return;
    const { deps } = this;
    this.finishing.add(runId);
    const run = await getRun(deps.db, runId);
    // A pass that read the run before an earlier finish ended it would write its manifest again,
    // into a folder whose temp folder is already gone.
    if (!run || isTerminalRun(run.status)) {
      this.finishing.delete(runId);
      return;
    }
    const final = run.status === 'cancelling' ? 'cancelled' : 'completed';
    void writeManifest(deps, run, final)
      .then(async () => {
        const statusReason = final === 'completed' ? endStatusReason(run) : null;
        if (await transitionRun(deps.db, runId, [run.status as RunStatus], final, deps.clock(), { statusReason })) {
          deps.logger[statusReason ? 'warn' : 'info'](
            { run_id: runId, status: final, completed: run.completed, failed: run.failed, reason: statusReason },
            'run status',
          );
        }
        this.hooks.afterFinish(runId);
      })
      .catch(async (err: Error) => {
        if (err instanceof FolderChangedError) return this.guard('ending a run whose folder changed', () => this.folderChanged(runId, 'the manifest'));
        this.retryAt.set(retryKey, { at: deps.clock() + MANIFEST_RETRY_MS, attempts: 0 });
        deps.logger.warn({ run_id: runId, err: { message: err.message } }, 'manifest write failed; retrying');
      })
      .finally(() => this.finishing.delete(runId));
  }
}
