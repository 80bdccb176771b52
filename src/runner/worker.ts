import { parentPort } from 'node:worker_threads';
import { closeDb, openDb } from '../db/client.js';
import { SecretKeyError } from '../db/secrets.js';
import type { RunnerDeps } from '../deps.js';
import { makeLogger } from '../logger.js';
import { Stores } from '../storage/index.js';
import { idleInTransactionMs, RunnerLockedError } from './lock.js';
import { Runner } from './runner.js';
import type { RetryReason } from '../domain/sample-errors.js';
import type { AnswerRepair, RunnerMetrics } from '../domain/metrics.js';
import type { TurnedAwayReason } from '../domain/turned-away.js';
import type { FromRunner, MetricsBatch, RunnerThreadInit, ToRunner } from './protocol.js';

/**
 * The runner's own thread: its own SQLite connection, object stores and event loop, so that
 * dispatch at full speed does not queue API reads behind it. Everything the API thread needs
 * from here travels as messages: log lines, metric increments, snapshots of the live view.
 * The thread loads its modules as soon as it exists and then waits for its settings, so that
 * loading overlaps with the API thread's own start-up.
 */

const SNAPSHOT_MS = 100;

const port = parentPort!;
const send = (m: FromRunner) => port.postMessage(m);

const emptyBatch = (): MetricsBatch => ({ answered: [], retried: [], repaired: [], shed: [], turnedAway: [], uploads: 0, uploadFailures: 0 });

/** Collects the runner's metric increments and sends them once per turn of the event loop. */
class ForwardedMetrics implements RunnerMetrics {
  private batch = emptyBatch();
  private scheduled = false;

  constructor(private readonly afterSend: () => void) {}

  answered(endpointId: string, latencyMs: number, completionTokens: number, flags: number): void {
    this.batch.answered.push([endpointId, latencyMs, completionTokens, flags]);
    this.schedule();
  }

  retried(reason: RetryReason): void {
    this.batch.retried.push(reason);
    this.schedule();
  }

  repaired(repair: AnswerRepair): void {
    this.batch.repaired.push(repair);
    this.schedule();
  }

  shed(failed: boolean): void {
    this.batch.shed.push(failed);
    this.schedule();
  }

  turnedAway(endpointId: string, reason: TurnedAwayReason): void {
    this.batch.turnedAway.push([endpointId, reason]);
    this.schedule();
  }

  shardUploaded(): void {
    this.batch.uploads++;
    this.schedule();
  }

  shardUploadFailed(): void {
    this.batch.uploadFailures++;
    this.schedule();
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      send({ type: 'metrics', batch: this.batch });
      this.batch = emptyBatch();
      this.afterSend();
    });
  }
}

const { config, logLevel } = await new Promise<RunnerThreadInit>((resolve) => port.once('message', resolve));
const logger = makeLogger(logLevel, { write: (line: string) => send({ type: 'log', line }) });
// As in `regen serve`: state lives in the database, so a stray rejection is logged, not fatal.
process.on('unhandledRejection', (err) => {
  logger.error({ err: { message: (err as Error)?.message, stack: (err as Error)?.stack } }, 'unhandled rejection in the runner thread');
});

const db = await openDb(config.store, {
  busyTimeoutMs: config.dbBusyTimeoutMs,
  secretKey: config.secretKey,
  idleInTransactionMs: idleInTransactionMs(config.replicaStaleMs),
});
db.secrets.whenLockedOut((err) => send({ type: 'locked_out', message: err.message }));
const stores = new Stores({ endpoint: config.s3Endpoint, forcePathStyle: config.s3ForcePathStyle });
let runner: Runner | null = null;
const sendSnapshot = () => {
  if (runner) send({ type: 'snapshot', snapshot: runner.snapshot() });
};
const deps: RunnerDeps = {
  config,
  db,
  stores,
  logger,
  clock: Date.now,
  // Once the last request in flight is answered, the API sees the endpoints idle at once.
  metrics: new ForwardedMetrics(() => {
    if (runner?.inFlight === 0) sendSnapshot();
  }),
  startIngest: (runId) => send({ type: 'ingest', runId }),
};

const close = async () => {
  stores.close();
  await closeDb(db);
};

/** After a deposed runner's successor failed to start (the database is likely away), the next try. */
const STAND_AGAIN_RETRY_MS = 1000;
let stopping = false;
/**
 * A runner deposed (PostgreSQL: taken for dead after a stall) is replaced by a fresh one, which
 * joins as a new replica; a start that fails (the database away) is tried again until it works or
 * the thread is asked to stop.
 */
const standAgain = () => {
  if (stopping) return;
  const next: Runner = new Runner(deps, standAgain);
  runner = next;
  next.start().catch((err: unknown) => {
    logger.warn({ err: { message: (err as Error).message } }, 'the runner could not start again; retrying');
    void next.stop(0).finally(() => setTimeout(standAgain, STAND_AGAIN_RETRY_MS).unref());
  });
};

try {
  runner = new Runner(deps, standAgain);
  await runner.start();
} catch (err) {
  runner = null;
  await close();
  const why = err instanceof RunnerLockedError ? 'locked' : err instanceof SecretKeyError ? 'secret_key' : 'other';
  send({ type: 'start_failed', why, message: (err as Error).message });
  port.close();
}

if (runner) {
  const snapshots = setInterval(sendSnapshot, SNAPSHOT_MS);
  port.on('message', (m: ToRunner) => {
    const live = runner!;
    if (m.type === 'wake') live.wake();
    else if (m.type === 'flush') {
      void live.flushNow().finally(() => send({ type: 'flushed' }));
    } else if (m.type === 'stop') {
      stopping = true;
      clearInterval(snapshots);
      void live
        .stop(m.graceMs)
        .then(close)
        .finally(() => {
          send({ type: 'stopped' });
          port.close();
        });
    }
  });
  sendSnapshot();
  send({ type: 'started' });
}
