import { serve, type ServerType } from '@hono/node-server';
import { mkdirSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { createApp } from './app.js';
import type { Config } from './config.js';
import { closeDb, diskFullCode, isDbBusy, openDb } from './db/client.js';
import { setStatusReason, validatingRunIds } from './db/runs.js';
import { checkStoredSecrets } from './db/secrets.js';
import { backoffMs, storeBackoff } from './domain/backoff.js';
import type { Deps } from './deps.js';
import { makeLogger, type Logger } from './logger.js';
import { idleInTransactionMs } from './runner/lock.js';
import { RunnerThread } from './runner/thread.js';
import { idleRunner } from './domain/live-view.js';
import { Metrics } from './services/metrics.js';
import { ingestRun } from './services/runs/ingest.js';
import { canonicalizeOutputUris, sweepUnfinishedWrites, warnDefaultOutputsHolders } from './services/runs/output-location.js';
import { WebhookDeliverer } from './services/webhooks.js';
import { ExpirySweeper } from './services/expiry.js';
import { Stores } from './storage/index.js';

/** Whether this process runs compiled JavaScript (dist/, or the test suite's tree) or the sources through tsx. */
const COMPILED = import.meta.url.endsWith('.js');

/** The runner as the process that started it controls it, whether in this thread or its own. */
export interface RunnerControl {
  /** Stops dispatch, waits up to the grace period for in-flight work, releases the rest, flushes. */
  stop(graceMs: number): Promise<void>;
  /** The last resort of a second signal: commit what is known; the rest returns on restart. */
  flushNow(): void | Promise<void>;
}

export interface Server {
  url: string;
  port: number;
  deps: Deps;
  runner: RunnerControl | null;
  /** Graceful: stop dispatch, wait up to the grace period for in-flight work, flush, close. */
  close(graceMs?: number): Promise<void>;
}

const LOOPBACK = new Set(['127.0.0.1', '::1', 'localhost']);

/** Ingestion runs one run at a time, in the background of the API process; stop() waits for it. */
function ingestQueue(getDeps: () => Deps, logger: Logger) {
  const queue: string[] = [];
  const stopping = new AbortController();
  let current: Promise<void> | null = null;
  /** Validations of a run that met a full disk in a row, for its backoff. */
  const diskFull = new Map<string, number>();
  /**
   * Runs whose retry is timed: a start() meanwhile (the coordinator's sweep of runs left validating)
   * would validate them at once, and each failure would add another timer.
   */
  const timed = new Set<string>();
  const retryLater = (runId: string, delayMs: number) => {
    timed.add(runId);
    setTimeout(() => {
      timed.delete(runId);
      start(runId);
    }, delayMs).unref();
  };
  const next = async () => {
    while (queue.length && !stopping.signal.aborted) {
      const runId = queue.shift()!;
      try {
        await ingestRun(getDeps(), runId, stopping.signal);
        diskFull.delete(runId);
      } catch (err) {
        const full = diskFullCode(err);
        if (!full) diskFull.delete(runId);
        if (full) {
          const deps = getDeps();
          const failures = (diskFull.get(runId) ?? 0) + 1;
          diskFull.set(runId, failures);
          const delayMs = backoffMs(failures, storeBackoff(deps.config.storeRetryMs));
          const reason = `validation waits for disk space (${full}); retrying in ${Math.ceil(delayMs / 1000)} s`;
          logger.warn({ run_id: runId, failures, code: full }, 'validation met a full disk; retrying');
          // Written where it can be: a database on the full disk may not take even this.
          await setStatusReason(deps.db, runId, reason, ['validating']).catch(() => {});
          retryLater(runId, delayMs);
          continue;
        }
        if (isDbBusy(err)) {
          // Another process held the write lock past busy_timeout: validate the run again, from the start.
          logger.warn({ run_id: runId, err: { message: (err as Error).message } }, 'validation hit a busy database; retrying');
          retryLater(runId, 1000);
          continue;
        }
        logger.error({ run_id: runId, err: { message: (err as Error).message, stack: (err as Error).stack } }, 'ingest crashed');
      }
    }
    current = null;
  };
  const start = (runId: string) => {
    if (stopping.signal.aborted || timed.has(runId) || queue.includes(runId)) return;
    queue.push(runId);
    current ??= next();
  };
  return {
    start,
    async stop() {
      stopping.abort();
      await current;
    },
  };
}

export interface StartOptions {
  logger?: Logger;
  /** Only with the runner in this thread (REGEN_RUNNER_THREAD=false): a function cannot reach another thread. */
  clock?: () => number;
  /** A runner thread spawned early (RunnerThread.spawn), so that its start-up overlapped this thread's. */
  runnerThread?: RunnerThread;
  /**
   * Told once this server has closed because a stored secret no longer opens (another replica
   * sealed them under a key this process lacks): `regen serve` exits with the error's line.
   */
  onLockedOut?: (err: Error) => void;
}

/** The port asked for is taken: `regen serve` says so in one line. */
export class PortInUseError extends Error {}

function listen(fetch: (request: Request) => Response | Promise<Response>, config: Config): Promise<ServerType> {
  return new Promise((resolve, reject) => {
    const s = serve({ fetch, hostname: config.host, port: config.port }, () => resolve(s));
    s.once('error', (err: NodeJS.ErrnoException) => {
      if (err.code !== 'EADDRINUSE') return reject(err);
      reject(new PortInUseError(`port ${config.port} on ${config.host} is in use; choose another with --port or REGEN_PORT`));
    });
  });
}

export async function startServer(config: Config, opts: StartOptions = {}): Promise<Server> {
  const useThread = config.runner && config.runnerThread;
  if (opts.runnerThread && !useThread) opts.runnerThread.discard();
  try {
    return await start(config, opts, useThread ? (opts.runnerThread ?? RunnerThread.spawn()) : null);
  } catch (err) {
    opts.runnerThread?.discard();
    throw err;
  }
}

async function start(config: Config, opts: StartOptions, thread: RunnerThread | null): Promise<Server> {
  if (config.apiTokens.length === 0 && !LOOPBACK.has(config.host) && !config.allowPublicBind) {
    throw new Error(`refusing to listen on ${config.host} without REGEN_API_TOKENS; set tokens, or REGEN_ALLOW_PUBLIC_BIND=true to accept an open server`);
  }
  mkdirSync(config.dataDir, { recursive: true });
  const logger = opts.logger ?? makeLogger(config.logLevel);
  const db = await openDb(config.store, {
    busyTimeoutMs: config.dbBusyTimeoutMs,
    secretKey: config.secretKey,
    idleInTransactionMs: idleInTransactionMs(config.replicaStaleMs),
  });
  try {
    await checkStoredSecrets(db);
  } catch (err) {
    await db.close();
    throw err;
  }
  // Met before the server listens, the error fails the start itself; after, the server closes.
  let lockedOut: Error | null = null;
  let onLockedOut = (err: Error) => {
    lockedOut = err;
  };
  db.secrets.whenLockedOut((err) => onLockedOut(err));
  const stores = new Stores({ endpoint: config.s3Endpoint, forcePathStyle: config.s3ForcePathStyle });
  const deps: Deps = {
    config,
    db,
    stores,
    logger,
    clock: opts.clock ?? Date.now,
    metrics: new Metrics(),
    runner: idleRunner,
    startIngest: () => {},
  };
  // Before the runner starts writing: old spellings of an output prefix must match the new ones' checks.
  await canonicalizeOutputUris(deps);
  await warnDefaultOutputsHolders(deps);
  await sweepUnfinishedWrites(deps);
  const ingest = ingestQueue(() => deps, logger);
  deps.startIngest = ingest.start;
  let runner: RunnerControl | null = null;
  if (thread) {
    if (opts.clock) throw new Error('an injected clock needs the runner in this thread (runnerThread: false)');
    await thread.start(deps, (err) => onLockedOut(err));
    deps.runner = thread.view;
    runner = thread;
  } else if (config.runner) {
    // Loaded on use: with the runner in its own thread, this thread never needs the openai client.
    const { Runner } = await import('./runner/runner.js');
    const inThread = new Runner(deps);
    deps.runner = inThread;
    await inThread.start();
    runner = inThread;
  } else {
    // Without a runner nothing else would validate the runs this API creates.
    for (const id of await validatingRunIds(db)) deps.startIngest(id);
  }
  // On this thread, not the runner's: a slow receiver must not hold up dispatch.
  const webhooks = new WebhookDeliverer(deps);
  webhooks.start();
  // On the API thread too: deleting expired objects is the object store's work, not dispatch's.
  const expiry = new ExpirySweeper(deps);
  expiry.start();
  const app = createApp(deps);
  let server: ServerType;
  try {
    server = await listen(app.fetch, config);
  } catch (err) {
    // Nothing was served: what started for it stops at once, with no grace period to wait out.
    await webhooks.stop();
    await expiry.stop();
    await ingest.stop();
    if (runner) await runner.stop(0);
    stores.close();
    await closeDb(db);
    throw err;
  }
  const port = (server.address() as AddressInfo).port;
  const host = config.host.includes(':') ? `[${config.host}]` : config.host;
  const url = `http://${host}:${port}`;
  // compiled: the build `npm ci` made (bin/regen.js), or false for the TypeScript through tsx.
  logger.info({ url, data_dir: config.dataDir, runner: !!runner, auth: config.apiTokens.length > 0, compiled: COMPILED }, 'regen listening');
  let closed = false;
  const served: Server = {
    url,
    port,
    deps,
    runner,
    async close(graceMs = config.shutdownGraceMs) {
      if (closed) return;
      closed = true;
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        (server as unknown as { closeIdleConnections?: () => void }).closeIdleConnections?.();
        setTimeout(() => (server as unknown as { closeAllConnections?: () => void }).closeAllConnections?.(), 1000).unref();
      });
      await ingest.stop();
      if (runner) await runner.stop(graceMs);
      await webhooks.stop();
      await expiry.stop();
      stores.close();
      await closeDb(db);
      logger.info('regen stopped');
    },
  };
  onLockedOut = (err) => {
    // No grace: nothing more can be sent without the key. Leases still held are released on the
    // way out, or returned by the coordinator's recovery once this replica's row goes stale.
    logger.error({ err: { message: err.message } }, "a stored secret does not open with this process's REGEN_SECRET_KEY; stopping");
    void served.close(0).finally(() => opts.onLockedOut?.(err));
  };
  if (lockedOut) onLockedOut(lockedOut);
  return served;
}
