import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { and, eq, inArray, sql } from 'drizzle-orm';
import { APIConnectionError, APIConnectionTimeoutError, APIError, APIUserAbortError } from 'openai';
import type { RunnerDeps } from '../deps.js';
import { getRun, transitionRun } from '../db/runs.js';
import { computeFlags } from '../domain/quality.js';
import { thinkingRequested } from '../domain/params.js';
import type { StagedOutput } from '../domain/output-line.js';
import type { SampleErrorCode } from '../domain/sample-errors.js';
import type { RunStatus } from '../domain/statuses.js';
import { runnerLock, runs, samples, shards, type RunRow } from '../db/schema.js';
import { EndpointPool, type LiveEndpoint } from './endpoints.js';
import { RateWindow } from './rates.js';
import { ResultWriter, type FlushReport, type Outcome, type Usage } from './results.js';
import { uploadShard, writeManifest } from './shard-writer.js';
import { IDLE_ENDPOINT, IDLE_PROGRESS, type EndpointLive, type RunnerSnapshot, type RunnerView, type RunProgress } from './view.js';
import { checkGate } from './gate.js';
import { expireBatches } from './batch-expiry.js';
import { describeStoreError } from '../storage/index.js';
import { RunnerLockedError } from './lock.js';

interface Claimed {
  id: number;
  runId: string;
  shardIdx: number;
  request: string;
  attempts: number;
  qualityRetries: number;
}

interface Flight {
  sample: Claimed;
  run: RunRow;
  endpoint: LiveEndpoint;
  controller: AbortController;
  /** Thinking was asked for this sample (a line's own params may turn it on or off). */
  thinking: boolean;
  /** Why we aborted it, if we did: decides what becomes of the sample. */
  abortReason: 'cancel' | 'release' | null;
}

const TICK_MS = 100;
const LEASE_MS = 24 * 3600_000;
const MAX_BUFFER = 512;
const LOCK_STALE_MS = 15_000;
const MANIFEST_RETRY_MS = 2000;

function backoffMs(attempt: number): number {
  const base = Math.min(30_000, 500 * 2 ** Math.max(0, attempt - 1));
  return Math.round(base / 2 + Math.random() * (base / 2));
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * The dispatcher: claims samples in shard order for the highest-priority runs, sends each to the
 * ready endpoint with the most free room for the run's model, refills a slot as soon as it frees,
 * records outcomes through the batched writer, uploads closed shards and finishes runs.
 */
export class Runner implements RunnerView {
  readonly owner = `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  readonly pool: EndpointPool;
  private readonly writer: ResultWriter;
  private readonly flights = new Map<number, Flight>();
  private readonly buffers = new Map<string, Claimed[]>();
  private readonly dry = new Set<string>();
  private readonly runRates = new Map<string, RateWindow>();
  private readonly uploading = new Set<string>();
  private readonly uploadRetryAt = new Map<string, number>();
  private readonly finishing = new Set<string>();
  private active: RunRow[] = [];
  private timer: NodeJS.Timeout | null = null;
  private heartbeat: NodeJS.Timeout | null = null;
  private stopping = false;
  private pumping = false;
  private woken = false;
  /** Leases up to `limit` pending samples of a run, in input order, and moves its counters with them. */
  private readonly claim: (runId: string, limit: number) => Omit<Claimed, 'runId'>[];

  constructor(private readonly deps: RunnerDeps) {
    this.pool = new EndpointPool(deps.db, deps.logger, deps.config.probeIntervalMs, () => this.wake(), (e) => this.abortEndpoint(e, 'release'));
    this.writer = new ResultWriter(deps.db, this.owner, deps.logger, (r) => this.guard('after a result commit', () => this.afterFlush(r)));
    const claimStmt = deps.db.$client.prepare(
      `update samples set status = 'in_progress', attempts = attempts + 1, lease_owner = ?, lease_expires_at = ?
       where id in (select id from samples where run_id = ? and status = 'pending' and available_at <= ? order by seq limit ?)
       returning id, shard_idx as shardIdx, request, attempts, quality_retries as qualityRetries`,
    );
    const countStmt = deps.db.$client.prepare(`update runs set pending = pending - ?, in_progress = in_progress + ? where id = ?`);
    // One transaction, so a crash between the two statements cannot leave the counters off by a batch.
    this.claim = deps.db.$client.transaction((runId: string, limit: number) => {
      const now = Date.now();
      const rows = claimStmt.all(this.owner, now + LEASE_MS, runId, now, limit) as Omit<Claimed, 'runId'>[];
      if (rows.length) countStmt.run(rows.length, rows.length, runId);
      return rows;
    });
  }

  // ---- start and stop ----

  /** Takes the runner lock, returns a dead owner's leases to the queue, resumes validation, starts ticking. */
  start(): void {
    this.takeLock();
    this.recover();
    this.pool.sync();
    this.refreshActive();
    this.timer = setInterval(() => this.guard('runner tick', () => this.tick()), TICK_MS);
    this.heartbeat = setInterval(() => this.guard('runner heartbeat', () => this.beat()), 5000);
    this.tick();
  }

  private takeLock(): void {
    const { db } = this.deps;
    const now = Date.now();
    db.transaction((tx) => {
      const held = tx.select().from(runnerLock).where(eq(runnerLock.id, 1)).get();
      const sameProcess = held?.hostname === hostname() && held.pid === process.pid;
      const alive = held && (held.hostname !== hostname() || pidAlive(held.pid));
      if (held && held.owner !== this.owner && !sameProcess && alive && now - held.heartbeatAt < LOCK_STALE_MS) {
        throw new RunnerLockedError(`another regen process (pid ${held.pid} on ${held.hostname}) is running dispatch on this database`);
      }
      tx.insert(runnerLock)
        .values({ id: 1, owner: this.owner, pid: process.pid, hostname: hostname(), heartbeatAt: now })
        .onConflictDoUpdate({ target: runnerLock.id, set: { owner: this.owner, pid: process.pid, hostname: hostname(), heartbeatAt: now } })
        .run();
    });
  }

  private beat(): void {
    const held = this.deps.db
      .update(runnerLock)
      .set({ heartbeatAt: Date.now() })
      .where(and(eq(runnerLock.id, 1), eq(runnerLock.owner, this.owner)))
      .run().changes;
    if (held === 0 && !this.stopping) {
      // Another process took the database over: two dispatchers would send samples twice.
      this.deps.logger.error({ owner: this.owner }, 'the runner lock was taken by another process; dispatch stops');
      void this.stop(0);
    }
  }

  private recover(): void {
    const { db, logger } = this.deps;
    const live = db
      .select({ id: runs.id, inProgress: runs.inProgress, status: runs.status })
      .from(runs)
      .where(inArray(runs.status, ['queued', 'in_progress', 'paused', 'cancelling', 'finalizing', 'validating']))
      .all();
    for (const r of live) {
      if (r.status === 'validating') {
        this.deps.startIngest(r.id);
        continue;
      }
      const released = db.transaction((tx) => {
        // Like a release on shutdown, an attempt cut short by a crash (or claimed and never sent) is not spent.
        const n = tx
          .update(samples)
          .set({ status: 'pending', attempts: sql`max(${samples.attempts} - 1, 0)`, leaseOwner: null, leaseExpiresAt: null })
          .where(and(eq(samples.runId, r.id), eq(samples.status, 'in_progress')))
          .run().changes;
        if (n) tx.update(runs).set({ pending: sql`${runs.pending} + ${n}`, inProgress: sql`${runs.inProgress} - ${n}` }).where(eq(runs.id, r.id)).run();
        return n;
      });
      if (released) logger.info({ run_id: r.id, released }, 'leases of a stopped process returned to the queue');
    }
  }

  /** Stops dispatch, lets in-flight requests finish for the grace period, releases the rest, flushes. */
  async stop(graceMs: number): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.releaseBuffers();
    const deadline = Date.now() + graceMs;
    while (this.flights.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    for (const f of this.flights.values()) this.abortFlight(f, 'release');
    while (this.flights.size > 0 && Date.now() < deadline + 2000) await new Promise((r) => setTimeout(r, 10));
    if (this.timer) clearInterval(this.timer);
    if (this.heartbeat) clearInterval(this.heartbeat);
    this.writer.close();
    for (const e of this.pool.live.values()) e.close();
    while (this.uploading.size > 0 && Date.now() < deadline + 5000) await new Promise((r) => setTimeout(r, 50));
    // Left behind, the lock goes stale within LOCK_STALE_MS: not worth failing a clean shutdown for.
    this.guard('releasing the runner lock', () => this.deps.db.delete(runnerLock).where(and(eq(runnerLock.id, 1), eq(runnerLock.owner, this.owner))).run());
  }

  /** The last-resort path of a second signal: commit what is known, leave the rest to recovery. */
  flushNow(): void {
    this.writer.flush();
  }

  // ---- RunnerView ----

  runProgress(runId: string): RunProgress {
    const r = this.runRates.get(runId)?.rates(this.deps.clock());
    return r ? { samples_per_second: r.samples, completion_tokens_per_second: r.tokens } : IDLE_PROGRESS;
  }

  endpointLive(endpointId: string): EndpointLive {
    const e = this.pool.live.get(endpointId);
    return e ? e.live(this.deps.clock()) : IDLE_ENDPOINT;
  }

  /** Every run's rates and every live endpoint's state at once, for the API thread to read from. */
  snapshot(): RunnerSnapshot {
    const now = this.deps.clock();
    const runs: RunnerSnapshot['runs'] = {};
    for (const id of this.runRates.keys()) runs[id] = this.runProgress(id);
    const endpoints: RunnerSnapshot['endpoints'] = {};
    for (const [id, e] of this.pool.live) endpoints[id] = e.live(now);
    return { runs, endpoints };
  }

  wake(): void {
    if (this.woken || this.stopping) return;
    this.woken = true;
    queueMicrotask(() => {
      this.woken = false;
      this.guard('runner wake', () => {
        this.pool.sync();
        this.refreshActive();
        this.pump();
      });
    });
  }

  get inFlight(): number {
    return this.flights.size;
  }

  // ---- the loop ----

  /**
   * Runs one step of the loop that the database may refuse (SQLITE_BUSY once busy_timeout is spent,
   * while another process holds the write lock): the step is logged and the next tick does it
   * again, instead of an exception from a timer taking the whole process down.
   */
  private guard<T>(what: string, step: () => T): T | undefined {
    try {
      return step();
    } catch (err) {
      this.deps.logger.warn({ err: { message: (err as Error).message, code: (err as { code?: unknown }).code } }, `${what} failed; retrying`);
      return undefined;
    }
  }

  private tick(): void {
    if (this.stopping) return;
    const now = Date.now();
    this.pool.probeDue(now);
    expireBatches(this.deps);
    this.refreshActive();
    this.dry.clear();
    this.pump();
    this.advanceRuns();
  }

  private refreshActive(): void {
    const { db } = this.deps;
    this.active = db
      .select()
      .from(runs)
      .where(inArray(runs.status, ['queued', 'in_progress', 'paused', 'cancelling', 'finalizing']))
      .orderBy(sql`${runs.priority} desc`, runs.createdAt)
      .all();
    const served = new Set<string>();
    for (const e of this.pool.live.values()) {
      if (e.state === 'ready' && e.row.model) served.add(e.row.model);
      // An endpoint that stopped answering gives its in-flight samples back to the queue.
      if (e.state === 'unhealthy' && e.inFlight.size) this.abortEndpoint(e, 'release');
    }
    // Claimed samples wait in a buffer only while some endpoint can take them; otherwise they
    // would sit `in_progress` for as long as the fleet is down.
    const dispatchable = new Set(
      this.active.filter((r) => (r.status === 'queued' || r.status === 'in_progress') && served.has(r.model)).map((r) => r.id),
    );
    for (const [runId] of this.buffers) if (!dispatchable.has(runId)) this.releaseBuffer(runId);
    for (const f of this.flights.values()) {
      const run = this.active.find((r) => r.id === f.run.id);
      if (!run || run.status === 'cancelling') this.abortFlight(f, 'cancel');
    }
  }

  /** Fills every free slot now. Called after each outcome, on wake and on every tick. */
  private pump(): void {
    if (this.pumping || this.stopping) return;
    this.pumping = true;
    try {
      const fallback = this.deps.config.defaultConcurrency;
      const runsFor = (model: string | null) =>
        this.active.filter((r) => (r.status === 'queued' || r.status === 'in_progress') && r.model === model && !this.dry.has(r.id));
      const idle = new Set<string>();
      for (;;) {
        let best: LiveEndpoint | null = null;
        let bestRoom = 0;
        for (const e of this.pool.live.values()) {
          if (e.state !== 'ready' || idle.has(e.row.id)) continue;
          const cap = e.cap(fallback);
          const room = (cap - e.inFlight.size) / cap;
          if (cap - e.inFlight.size > 0 && (room > bestRoom || (room === bestRoom && best && e.row.weight > best.row.weight))) {
            best = e;
            bestRoom = room;
          }
        }
        if (!best) break;
        let sent = false;
        for (const run of runsFor(best.row.model)) {
          const sample = this.take(run, best.row.model!);
          if (!sample) continue;
          this.send(best, run, sample);
          sent = true;
          break;
        }
        if (!sent) idle.add(best.row.id);
      }
    } finally {
      this.pumping = false;
    }
  }

  /** The next sample of a run: from its buffer, else claimed from the database in one statement. */
  private take(run: RunRow, model: string): Claimed | null {
    let buf = this.buffers.get(run.id);
    if (!buf || buf.length === 0) {
      const fallback = this.deps.config.defaultConcurrency;
      let room = 0;
      let cap = 0;
      for (const e of this.pool.live.values()) {
        if (e.state !== 'ready' || e.row.model !== model) continue;
        cap += e.cap(fallback);
        room += Math.max(0, e.cap(fallback) - e.inFlight.size);
      }
      // Claiming one sample per freed slot would cost a statement per request: claim at least half
      // the fleet's slots at once, so the claim cost is spread over many requests.
      const rows = this.claim(run.id, Math.min(MAX_BUFFER, Math.max(1, room, Math.ceil(cap / 2))));
      if (rows.length === 0) {
        this.dry.add(run.id);
        return null;
      }
      rows.sort((a, b) => a.id - b.id);
      buf = rows.map((r) => ({ ...r, runId: run.id }));
      this.buffers.set(run.id, buf);
      if (run.status === 'queued') {
        const at = this.deps.clock();
        if (transitionRun(this.deps.db, run.id, ['queued'], 'in_progress', at, run.startedAt ? {} : { startedAt: at })) {
          this.deps.logger.info({ run_id: run.id, status: 'in_progress' }, 'run status');
        }
        run.status = 'in_progress';
      }
    }
    return buf.shift() ?? null;
  }

  private releaseBuffer(runId: string): void {
    const buf = this.buffers.get(runId);
    this.buffers.delete(runId);
    if (!buf) return;
    for (const s of buf) this.writer.add({ kind: 'release', sampleId: s.id, runId, shardIdx: s.shardIdx, endpointId: null });
  }

  private releaseBuffers(): void {
    for (const runId of [...this.buffers.keys()]) this.releaseBuffer(runId);
    this.writer.flush();
  }

  private abortFlight(f: Flight, reason: 'cancel' | 'release'): void {
    if (f.abortReason) return;
    f.abortReason = reason;
    f.controller.abort();
  }

  private abortEndpoint(e: LiveEndpoint, reason: 'cancel' | 'release'): void {
    for (const id of e.inFlight.keys()) {
      const f = this.flights.get(id);
      if (f) this.abortFlight(f, reason);
    }
  }

  // ---- one request ----

  private send(e: LiveEndpoint, run: RunRow, sample: Claimed): void {
    const request = JSON.parse(sample.request) as { messages: unknown[]; params?: Record<string, unknown> };
    const params = request.params ? { ...run.params, ...request.params } : run.params;
    const controller = new AbortController();
    const flight: Flight = { sample, run, endpoint: e, controller, thinking: thinkingRequested(params), abortReason: null };
    this.flights.set(sample.id, flight);
    e.inFlight.set(sample.id, controller);
    const body: Record<string, unknown> = { ...params, model: run.model, messages: request.messages };
    if (sample.qualityRetries > 0) {
      // A flagged answer is asked again with a different seed, else SGLang would repeat it.
      const base = typeof params.seed === 'number' ? params.seed : 0;
      body.seed = base + sample.qualityRetries * 7919 + Math.floor(Math.random() * 1000);
    }
    const started = Date.now();
    e.client.chat.completions
      .create(body as never, { signal: controller.signal, timeout: run.requestTimeoutMs })
      .then(
        (res) => this.onResponse(flight, res as unknown as ChatResponse, Date.now() - started),
        (err) => this.onError(flight, err),
      )
      .catch((err: Error) => {
        // An answer the code could not take (malformed, or a database fault): the sample goes back to
        // the queue as a retry; the process must not die over one response.
        this.deps.logger.error({ run_id: run.id, endpoint_id: e.row.id, err: { message: err.message, stack: err.stack } }, 'could not record an answer');
        this.guard('recording an answer', () => this.onError(flight, err));
      })
      .finally(() => {
        this.flights.delete(sample.id);
        e.inFlight.delete(sample.id);
        this.guard('refilling a slot', () => this.pump());
        // Batching commits only pays while answers keep coming; the last ones of a run need not
        // wait out the interval before their shard can close.
        if (this.flights.size === 0) this.guard('committing results', () => this.writer.flush());
      });
  }

  private onResponse(f: Flight, res: ChatResponse, latencyMs: number): void {
    const { sample, run, endpoint: e } = f;
    e.consecutiveFailures = 0;
    if (!res || typeof res !== 'object' || !Array.isArray(res.choices) || !res.choices[0]) {
      return this.onError(f, new MalformedAnswer('the endpoint answered 200 without choices'));
    }
    const choice = res.choices[0];
    const msg = choice?.message ?? {};
    const u = res.usage ?? {};
    const usage: Usage = {
      prompt_tokens: u.prompt_tokens ?? 0,
      completion_tokens: u.completion_tokens ?? 0,
      reasoning_tokens: u.reasoning_tokens ?? u.completion_tokens_details?.reasoning_tokens ?? 0,
      cached_tokens: u.prompt_tokens_details?.cached_tokens ?? 0,
    };
    const content = typeof msg.content === 'string' ? msg.content : null;
    const reasoning = typeof msg.reasoning_content === 'string' ? msg.reasoning_content : null;
    const finishReason = choice?.finish_reason ?? null;
    const now = this.deps.clock();
    e.latency.add(latencyMs);
    e.rate.add(now, 1, usage.completion_tokens);
    const base = { sampleId: sample.id, runId: run.id, shardIdx: sample.shardIdx, endpointId: e.row.id };
    const flags = run.quality
      ? computeFlags(
          { content, reasoning_content: reasoning, finish_reason: finishReason, completion_tokens: usage.completion_tokens, thinking_requested: f.thinking },
          { min_completion_tokens: run.quality.min_completion_tokens },
        )
      : 0;
    this.deps.metrics.answered(e.row.id, latencyMs, usage.completion_tokens, flags);
    // A cancelled run keeps an answer that arrived anyway, but asks nothing again.
    if (flags && run.quality && sample.qualityRetries < run.quality.retry_flagged && f.abortReason !== 'cancel') {
      this.deps.metrics.retried('quality');
      return this.writer.add({ ...base, kind: 'retry', availableAt: 0, usage, qualityRetry: true, error: null });
    }
    const output: StagedOutput = { reasoning_content: reasoning, content, model: res.model ?? run.model, response_id: res.id, created: res.created };
    const chars = { reasoning: reasoning?.length ?? 0, content: content?.length ?? 0 };
    this.writer.add({ ...base, kind: 'completed', usage, finishReason, latencyMs, flags, chars, output: JSON.stringify(output), at: now });
  }

  private onError(f: Flight, err: unknown): void {
    const { sample, run, endpoint: e } = f;
    const base = { sampleId: sample.id, runId: run.id, shardIdx: sample.shardIdx, endpointId: e.row.id };
    if (f.abortReason === 'cancel') return this.writer.add({ ...base, kind: 'cancelled' });
    if (f.abortReason === 'release') return this.writer.add({ ...base, kind: 'release' });
    let code: SampleErrorCode;
    let message: string;
    let status: number | null = null;
    let retryable = true;
    if (err instanceof APIConnectionTimeoutError || (err instanceof APIUserAbortError && !f.abortReason)) {
      // Not held against the endpoint: long generations on a busy server time out together, and
      // a server that has really hung fails its health probe.
      code = 'timeout';
      message = `no answer within ${run.requestTimeoutMs} ms`;
    } else if (err instanceof MalformedAnswer) {
      code = 'malformed_response';
      message = err.message;
    } else if (err instanceof APIConnectionError) {
      code = 'connection_error';
      message = 'the connection to the endpoint failed';
      this.guard('marking an endpoint', () => this.pool.transportFailure(e, message) && this.abortEndpoint(e, 'release'));
    } else if (err instanceof APIError && err.status) {
      const s = err.status;
      status = s;
      message = errorMessage(err);
      e.consecutiveFailures = 0;
      if (s === 429) code = 'rate_limited';
      else if (s >= 500 || s === 408 || s === 409 || s === 425) code = 'server_error';
      else if (s === 401 || s === 403 || s === 404) {
        // The endpoint, not the sample, is wrong (bad key, another model loaded): probe it again,
        // and give the sample back without spending its attempt.
        this.guard('marking an endpoint', () => this.pool.setState(e, 'starting', `${s}: ${message}`.slice(0, 300)));
        return this.writer.add({ ...base, kind: 'release' });
      } else {
        code = 'invalid_request';
        retryable = false;
      }
    } else {
      code = 'internal_error';
      message = (err as Error)?.message?.slice(0, 300) ?? 'unknown error';
    }
    const error = { code, message, status };
    if (!retryable || sample.attempts >= run.maxAttempts) return this.writer.add({ ...base, kind: 'failed', error, at: Date.now() });
    this.deps.metrics.retried(code);
    this.writer.add({ ...base, kind: 'retry', availableAt: Date.now() + backoffMs(sample.attempts), usage: null, qualityRetry: false, error });
  }

  // ---- after each commit ----

  private afterFlush(r: FlushReport): void {
    const now = this.deps.clock();
    for (const [runId, d] of r.runs) {
      if (d.completed) {
        let w = this.runRates.get(runId);
        if (!w) this.runRates.set(runId, (w = new RateWindow()));
        w.add(now, d.completed, d.tokens);
      }
      const run = getRun(this.deps.db, runId);
      if (run && checkGate(this.deps, run)) {
        this.releaseBuffer(runId);
        this.refreshActive();
      }
    }
    if (r.closedShards.length) this.advanceRuns();
  }

  /** Cancels what is left of cancelling runs, uploads closed shards, and finishes runs whose work is done. */
  private advanceRuns(): void {
    const { db } = this.deps;
    for (const run of this.active) {
      if (run.status === 'cancelling') this.cancelPending(run);
      const fresh = getRun(db, run.id);
      if (!fresh) continue;
      const closed = db
        .select()
        .from(shards)
        .where(and(eq(shards.runId, run.id), eq(shards.status, 'open'), sql`${shards.terminalCount} = ${shards.sampleCount}`))
        .limit(8)
        .all();
      for (const shard of closed) this.upload(fresh, shard);
      const settled = fresh.pending === 0 && fresh.inProgress === 0 && fresh.total > 0;
      if (!settled) continue;
      if (fresh.status === 'in_progress' || fresh.status === 'queued') {
        if (transitionRun(db, run.id, [fresh.status as RunStatus], 'finalizing', this.deps.clock())) {
          this.deps.logger.info({ run_id: run.id, status: 'finalizing' }, 'run status');
        }
      }
      if (fresh.shardsUploaded === fresh.shardsTotal && (fresh.status === 'finalizing' || fresh.status === 'cancelling' || fresh.status === 'in_progress')) {
        this.finish(run.id);
      }
    }
  }

  private cancelPending(run: RunRow): void {
    const { db } = this.deps;
    db.transaction((tx) => {
      const perShard = tx
        .select({ idx: samples.shardIdx, n: sql<number>`count(*)` })
        .from(samples)
        .where(and(eq(samples.runId, run.id), eq(samples.status, 'pending')))
        .groupBy(samples.shardIdx)
        .all();
      if (!perShard.length) return;
      const n = tx.update(samples).set({ status: 'cancelled' }).where(and(eq(samples.runId, run.id), eq(samples.status, 'pending'))).run().changes;
      for (const s of perShard) {
        tx.update(shards).set({ terminalCount: sql`${shards.terminalCount} + ${s.n}` }).where(and(eq(shards.runId, run.id), eq(shards.idx, s.idx))).run();
      }
      tx.update(runs).set({ pending: sql`${runs.pending} - ${n}`, cancelled: sql`${runs.cancelled} + ${n}` }).where(eq(runs.id, run.id)).run();
    });
  }

  private upload(run: RunRow, shard: typeof shards.$inferSelect): void {
    const key = `${run.id}\0${shard.idx}`;
    if (this.uploading.has(key) || (this.uploadRetryAt.get(key) ?? 0) > Date.now() || this.uploading.size >= 4) return;
    this.uploading.add(key);
    uploadShard(this.deps, run, shard)
      .then((done) => {
        this.uploadRetryAt.delete(key);
        if (!done) return;
        // The store answers again: the run's other shards waiting out a backoff need not wait longer.
        for (const k of this.uploadRetryAt.keys()) if (k.startsWith(`${run.id}\0`)) this.uploadRetryAt.delete(k);
        this.deps.metrics.shardUploaded();
        // Outside the upload's own error path: a fault here must not be taken for a failed upload.
        setImmediate(() => this.guard('advancing runs', () => this.advanceRuns()));
      })
      .catch((err: Error) => {
        this.deps.metrics.shardUploadFailed();
        const attempts = shard.uploadAttempts + 1;
        const delayMs = Math.min(60_000, 1000 * 2 ** Math.min(attempts, 6));
        this.uploadRetryAt.set(key, Date.now() + delayMs);
        const lastError = `upload failed: ${describeStoreError(err)}; retrying in ${Math.round(delayMs / 1000)} s`;
        this.deps.logger.warn({ run_id: run.id, shard: shard.idx, attempts, err: { message: err.message } }, 'shard upload failed');
        this.guard('recording a failed shard upload', () =>
          this.deps.db
            .update(shards)
            .set({ uploadAttempts: attempts, lastError })
            .where(and(eq(shards.runId, run.id), eq(shards.idx, shard.idx)))
            .run(),
        );
      })
      .finally(() => this.uploading.delete(key));
  }

  private finish(runId: string): void {
    const retryKey = `${runId}\0manifest`;
    if (this.finishing.has(runId) || (this.uploadRetryAt.get(retryKey) ?? 0) > Date.now()) return;
    this.finishing.add(runId);
    const run = getRun(this.deps.db, runId)!;
    const final = run.status === 'cancelling' ? 'cancelled' : 'completed';
    writeManifest(this.deps, run, final)
      .then(() => {
        if (transitionRun(this.deps.db, runId, [run.status as RunStatus], final, this.deps.clock())) {
          this.deps.logger.info({ run_id: runId, status: final, completed: run.completed, failed: run.failed }, 'run status');
        }
        // A finished run has no rate; its window would otherwise stay in memory for the life of the process.
        this.runRates.delete(runId);
        this.refreshActive();
      })
      .catch((err: Error) => {
        // Not on every tick: an object store that is down would get ten writes a second.
        this.uploadRetryAt.set(retryKey, Date.now() + MANIFEST_RETRY_MS);
        this.deps.logger.warn({ run_id: runId, err: { message: err.message } }, 'manifest write failed; retrying');
      })
      .finally(() => this.finishing.delete(runId));
  }
}

class MalformedAnswer extends Error {}

interface ChatResponse {
  id?: string;
  created?: number;
  model?: string;
  choices?: { message?: { content?: unknown; reasoning_content?: unknown }; finish_reason?: string | null }[];
  usage?: {
    prompt_tokens?: number;
    completion_tokens?: number;
    reasoning_tokens?: number;
    completion_tokens_details?: { reasoning_tokens?: number };
    prompt_tokens_details?: { cached_tokens?: number };
  };
}

/** SGLang's error body is `{object: "error", message, ...}`; keep its message, bounded. */
function errorMessage(err: APIError): string {
  const body = err.error as { message?: unknown } | undefined;
  const m = typeof body?.message === 'string' ? body.message : err.message;
  return m.slice(0, 1000);
}

