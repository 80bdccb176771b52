import type { RunnerDeps } from '../deps.js';
import { getRun, transitionRun } from '../db/runs.js';
import { cancelPendingSamples } from '../db/samples.js';
import type { RunRow, ShardRow } from '../db/schema.js';
import { closedOpenShards, recordUploadFailure } from '../db/shards.js';
import type { RunStatus } from '../domain/statuses.js';
import { describeStoreError } from '../storage/index.js';
import { backoffMs, UPLOAD_BACKOFF } from '../domain/backoff.js';
import { Coalesced } from './coalesced.js';
import { uploadShard, writeManifest } from './shard-writer.js';

/** Shard uploads under way at once: enough to hide the store's latency, few enough not to flood it. */
const MAX_CONCURRENT_UPLOADS = 4;
/** Closed shards looked at per run and pass; the next pass takes the rest. */
const SHARDS_PER_PASS = 8;
/** A failed manifest write waits this long: not on every tick, or a store that is down gets ten writes a second. */
const MANIFEST_RETRY_MS = 2000;

/**
 * The end of a run's samples: cancels what is left of cancelling runs, uploads each shard once all
 * its samples are terminal, moves a settled run to finalizing, and once every shard is uploaded
 * writes the manifest and ends the run (completed or cancelled).
 */
export class Finisher {
  private readonly uploading = new Set<string>();
  private readonly retryAt = new Map<string, number>();
  private readonly finishing = new Set<string>();

  constructor(
    private readonly deps: RunnerDeps,
    private readonly guard: <T>(what: string, step: () => T) => T | undefined,
    private readonly hooks: { afterUpload(): unknown; settled(run: RunRow): Promise<unknown>; afterFinish(runId: string): void },
  ) {}

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
      }
    }
  }

  private key(runId: string, what: number | 'manifest'): string {
    return `${runId}\0${what}`;
  }

  private waiting(key: string): boolean {
    return (this.retryAt.get(key) ?? 0) > this.deps.clock();
  }

  private upload(run: RunRow, shard: ShardRow): void {
    const key = this.key(run.id, shard.idx);
    if (this.uploading.has(key) || this.waiting(key) || this.uploading.size >= MAX_CONCURRENT_UPLOADS) return;
    const { deps } = this;
    this.uploading.add(key);
    uploadShard(deps, run, shard)
      .then((done) => {
        this.retryAt.delete(key);
        if (!done) return;
        // The store answers again: the run's other shards waiting out a backoff need not wait longer.
        for (const k of this.retryAt.keys()) if (k.startsWith(`${run.id}\0`)) this.retryAt.delete(k);
        deps.metrics.shardUploaded();
        // Outside the upload's own error path: a fault here must not be taken for a failed upload.
        setImmediate(() => void this.guard('advancing runs', () => this.hooks.afterUpload()));
      })
      .catch((err: Error) => {
        deps.metrics.shardUploadFailed();
        const attempts = shard.uploadAttempts + 1;
        const delayMs = backoffMs(attempts, UPLOAD_BACKOFF);
        this.retryAt.set(key, deps.clock() + delayMs);
        const lastError = `upload failed: ${describeStoreError(err)}; retrying in ${Math.round(delayMs / 1000)} s`;
        deps.logger.warn({ run_id: run.id, shard: shard.idx, attempts, err: { message: err.message } }, 'shard upload failed');
        return this.guard('recording a failed shard upload', () => recordUploadFailure(deps.db, run.id, shard.idx, attempts, lastError));
      })
      .finally(() => this.uploading.delete(key));
  }

  private async finish(runId: string): Promise<void> {
    const retryKey = this.key(runId, 'manifest');
    if (this.finishing.has(runId) || this.waiting(retryKey)) return;
    const { deps } = this;
    this.finishing.add(runId);
    const run = await getRun(deps.db, runId);
    if (!run) {
      this.finishing.delete(runId);
      return;
    }
    const final = run.status === 'cancelling' ? 'cancelled' : 'completed';
    void writeManifest(deps, run, final)
      .then(async () => {
        if (await transitionRun(deps.db, runId, [run.status as RunStatus], final, deps.clock())) {
          deps.logger.info({ run_id: runId, status: final, completed: run.completed, failed: run.failed }, 'run status');
        }
        this.hooks.afterFinish(runId);
      })
      .catch((err: Error) => {
        this.retryAt.set(retryKey, deps.clock() + MANIFEST_RETRY_MS);
        deps.logger.warn({ run_id: runId, err: { message: err.message } }, 'manifest write failed; retrying');
      })
      .finally(() => this.finishing.delete(runId));
  }
}
