import { Worker } from 'node:worker_threads';
import type { Deps } from '../deps.js';
import type { Logger } from '../logger.js';
import { SecretKeyError } from '../db/secrets.js';
import { RunnerLockedError } from './lock.js';
import { snapshotView, type RunnerSnapshot, type RunnerView } from '../domain/live-view.js';
import type { FromRunner, RunnerThreadInit, ToRunner } from './protocol.js';

/** How long a second signal waits for the runner thread to commit what it knows. */
const FLUSH_WAIT_MS = 1000;
/** After an unexpected exit, the pause before a new runner thread takes the leases back. */
const RESTART_DELAY_MS = 1000;
/** Past the grace period, how long stop() waits for the thread to release its leases and close. */
const STOP_SLACK_MS = 15_000;
const YOUNG_GENERATION_MB = 8;

const LEVELS: Record<number, 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal'> = {
  10: 'trace',
  20: 'debug',
  30: 'info',
  40: 'warn',
  50: 'error',
  60: 'fatal',
};

/** Writes a runner-thread log line through this thread's logger, so there is one log stream. */
function relayLog(logger: Logger, line: string): void {
  const { level, msg, time: _time, pid: _pid, hostname: _hostname, service: _service, ...fields } = JSON.parse(line) as Record<string, unknown>;
  logger[LEVELS[level as number] ?? 'info'](fields, msg as string);
}

/**
 * The runner in a worker thread of its own. It implements the API's RunnerView from the
 * snapshots the thread sends (at most 100 ms old), applies its metric increments to this
 * process's registry and starts validation when recovery finds a run still validating.
 * A thread that dies unexpectedly is started again: its successor returns the leases it held.
 */
export class RunnerThread {
  readonly view: RunnerView;
  private latest: RunnerSnapshot = { runs: {}, endpoints: {} };
  private worker!: Worker;
  private deps: Deps | null = null;
  private lockedOut: (err: Error) => void = () => {};
  private stopping = false;
  private exited = false;
  private bootError: Error | null = null;
  private starting: { resolve(): void; reject(err: Error): void } | null = null;
  private waiters = new Map<'flushed' | 'stopped', () => void>();

  private constructor() {
    this.view = snapshotView(
      () => this.latest,
      () => this.post({ type: 'wake' }),
    );
    this.spawn();
  }

  /**
   * Starts the thread's Node and its module loading now, before this thread loads the server, so
   * the two overlap; start() hands it its settings later. Costs one idle thread if never started.
   */
  static spawn(): RunnerThread {
    return new RunnerThread();
  }

  /**
   * Resolves once the thread holds the runner lock and dispatches; rejects as the in-thread Runner
   * would. `lockedOut` is told when the thread meets a stored secret its key does not open.
   */
  start(deps: Deps, lockedOut: (err: Error) => void = () => {}): Promise<void> {
    this.deps = deps;
    this.lockedOut = lockedOut;
    if (this.bootError || this.exited) return Promise.reject(this.bootError ?? new Error('the runner thread exited before it started'));
    return new Promise((resolve, reject) => {
      this.starting = { resolve, reject };
      const init: RunnerThreadInit = { type: 'init', config: deps.config, logLevel: deps.logger.level };
      this.worker.postMessage(init);
    });
  }

  /** Asks the thread to commit its pending results now; gives up after a second. */
  async flushNow(): Promise<void> {
    await this.request({ type: 'flush' }, 'flushed', FLUSH_WAIT_MS);
  }

  /** Graceful: the thread drains for `graceMs`, releases the rest and closes its connection. */
  async stop(graceMs: number): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    await this.request({ type: 'stop', graceMs }, 'stopped', graceMs + STOP_SLACK_MS);
    await this.worker.terminate();
  }

  /** Ends a thread that will not be started (the runner is off, or start-up failed first). */
  discard(): void {
    this.stopping = true;
    void this.worker.terminate();
  }

  private spawn(): void {
    // The dispatch loop makes short-lived garbage quickly; a small young generation keeps the
    // thread's memory near its live data at the price of more (cheap) scavenges.
    const worker = new Worker(new URL('./worker-boot.mjs', import.meta.url), { resourceLimits: { maxYoungGenerationSizeMb: YOUNG_GENERATION_MB } });
    this.worker = worker;
    this.exited = false;
    this.bootError = null;
    let started = false;
    worker.on('message', (m: FromRunner) => {
      if (m.type === 'started') {
        started = true;
        this.starting?.resolve();
        this.starting = null;
      } else if (m.type === 'start_failed') {
        const failure = { locked: RunnerLockedError, secret_key: SecretKeyError, other: Error }[m.why];
        this.starting?.reject(new failure(m.message));
        this.starting = null;
      } else this.receive(m);
    });
    worker.on('error', (err) => {
      this.deps?.logger.error({ err: { message: err.message, stack: err.stack } }, 'the runner thread failed');
      if (started) return;
      this.bootError = err;
      this.starting?.reject(err);
      this.starting = null;
    });
    worker.on('exit', (code) => {
      this.exited = true;
      for (const done of this.waiters.values()) done();
      this.waiters.clear();
      this.starting?.reject(new Error(`the runner thread exited (code ${code}) before it started`));
      this.starting = null;
      if (!started || this.stopping || !this.deps) return;
      const deps = this.deps;
      deps.logger.error({ exit_code: code, restart_in_ms: RESTART_DELAY_MS }, 'the runner thread stopped unexpectedly; starting it again');
      setTimeout(() => {
        if (this.stopping) return;
        this.latest = { runs: {}, endpoints: {} };
        this.spawn();
        this.start(deps).catch((err: Error) => deps.logger.error({ err: { message: err.message } }, 'the runner thread could not start again'));
      }, RESTART_DELAY_MS).unref();
    });
  }

  private receive(m: FromRunner): void {
    const deps = this.deps!;
    switch (m.type) {
      case 'log':
        relayLog(deps.logger, m.line);
        break;
      case 'snapshot':
        this.latest = m.snapshot;
        break;
      case 'metrics':
        for (const [endpointId, latencyMs, tokens, flags] of m.batch.answered) deps.metrics.answered(endpointId, latencyMs, tokens, flags);
        for (const reason of m.batch.retried) deps.metrics.retried(reason);
        for (const repair of m.batch.repaired) deps.metrics.repaired(repair);
        for (const failed of m.batch.shed) deps.metrics.shed(failed);
        for (const [endpointId, reason] of m.batch.turnedAway) deps.metrics.turnedAway(endpointId, reason);
        for (let i = 0; i < m.batch.uploads; i++) deps.metrics.shardUploaded();
        for (let i = 0; i < m.batch.uploadFailures; i++) deps.metrics.shardUploadFailed();
        break;
      case 'ingest':
        deps.startIngest(m.runId);
        break;
      case 'locked_out':
        this.lockedOut(new SecretKeyError(m.message));
        break;
      case 'flushed':
      case 'stopped':
        this.waiters.get(m.type)?.();
        this.waiters.delete(m.type);
        break;
    }
  }

  private post(m: ToRunner): void {
    this.worker.postMessage(m);
  }

  /** Sends `m` and waits for the thread's `reply`, its exit or `timeoutMs`, whichever comes first. */
  private request(m: ToRunner, reply: 'flushed' | 'stopped', timeoutMs: number): Promise<void> {
    if (this.exited) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, timeoutMs);
      timer.unref();
      this.waiters.set(reply, () => {
        clearTimeout(timer);
        resolve();
      });
      this.post(m);
    });
  }
}
