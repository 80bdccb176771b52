import type { RunnerDeps } from '../deps.js';
import type { RunRow } from '../db/schema.js';
import type { Claimed } from './claim-buffer.js';
import type { EndpointPool, LiveEndpoint } from './endpoints.js';
import { settleAbort, settleAnswer, settleError, type Attempt, type Settled } from './outcomes.js';
import { buildRequest, classifyError, parseAnswer } from './request.js';
import type { ResultWriter } from './results.js';
import type { RunQuality } from '../domain/run-quality.js';

export type AbortReason = 'cancel' | 'release';

export interface Flight {
  sample: Claimed;
  run: RunRow;
  endpoint: LiveEndpoint;
  controller: AbortController;
  thinking: boolean;
  /** Why regen aborted it, if it did: decides what becomes of the sample. */
  abortReason: AbortReason | null;
}

/**
 * The requests in flight: each sample sent to its endpoint, its answer or error turned into an
 * outcome for the result writer, and the endpoint's health and stats moved with it. Regen aborts a
 * request itself only to cancel its run or to give its sample back (shutdown, a dead endpoint).
 */
export class Requests {
  private readonly flights = new Map<number, Flight>();

  constructor(
    private readonly deps: RunnerDeps,
    private readonly pool: EndpointPool,
    private readonly writer: ResultWriter,
    private readonly guard: <T>(what: string, step: () => T) => T | undefined,
    private readonly hooks: {
      /** After each request has settled and left its slot. */
      settled(): void;
      /** The quality checks of a run, or null when the run turned them off. */
      qualityOf(run: RunRow): RunQuality | null;
      /** An answer arrived (whatever its flags): what the forecast measures the fleet's speed from. */
      answered(run: RunRow, endpointId: string, tokens: number, latencyMs: number, now: number): void;
    },
  ) {}

  get size(): number {
    return this.flights.size;
  }

  all(): IterableIterator<Flight> {
    return this.flights.values();
  }

  send(e: LiveEndpoint, run: RunRow, sample: Claimed): void {
    const { body, thinking } = buildRequest(run, sample);
    const controller = new AbortController();
    const flight: Flight = { sample, run, endpoint: e, controller, thinking, abortReason: null };
    this.flights.set(sample.id, flight);
    e.inFlight.set(sample.id, controller);
    const started = this.deps.clock();
    e.client.chat.completions
      .create(body as never, { signal: controller.signal, timeout: run.requestTimeoutMs })
      .then(
        (res) => this.onResponse(flight, res, this.deps.clock() - started),
        (err) => this.onError(flight, err),
      )
      .catch((err: Error) => {
        // An answer the code could not take (a database fault, say): the sample goes back to the
        // queue as a retry; the process must not die over one response.
        this.deps.logger.error({ run_id: run.id, endpoint_id: e.row.id, err: { message: err.message, stack: err.stack } }, 'could not record an answer');
        this.guard('recording an answer', () => this.onError(flight, err));
      })
      .finally(() => {
        this.flights.delete(sample.id);
        e.inFlight.delete(sample.id);
        this.hooks.settled();
      });
  }

  private attempt(f: Flight): Attempt {
    const { sample, run, endpoint } = f;
    return {
      sampleId: sample.id,
      runId: run.id,
      shardIdx: sample.shardIdx,
      endpointId: endpoint.row.id,
      attempts: sample.attempts,
      qualityRetries: sample.qualityRetries,
      serverFaults: sample.serverFaults,
      thinking: f.thinking,
      cancelled: f.abortReason === 'cancel',
      quarantined: endpoint.state === 'quarantined',
    };
  }

  private limits(run: RunRow): { maxAttempts: number; maxServerFaults: number } {
    return { maxAttempts: run.maxAttempts, maxServerFaults: this.deps.config.maxServerFaults };
  }

  private settle({ outcome, retried }: Settled): void {
    if (retried) this.deps.metrics.retried(retried);
    this.writer.add(outcome);
  }

  private onResponse(f: Flight, res: unknown, latencyMs: number): void {
    const e = f.endpoint;
    e.consecutiveFailures = 0;
    const parsed = parseAnswer(res);
    if (!parsed.ok) {
      if (f.abortReason) this.onError(f, null);
      else this.settle(settleError(this.attempt(f), this.limits(f.run), parsed.error, this.deps.clock()));
      return;
    }
    const now = this.deps.clock();
    const tokens = parsed.answer.usage.completion_tokens;
    e.latency.add(latencyMs);
    e.rate.add(now, 1, tokens);
    this.hooks.answered(f.run, e.row.id, tokens, latencyMs, now);
    const { answer } = parsed;
    const quality = this.hooks.qualityOf(f.run);
    const input = {
      content: answer.content,
      reasoning_content: answer.reasoning,
      finish_reason: answer.finishReason,
      completion_tokens: tokens,
      thinking_requested: f.thinking,
    };
    const flags = quality ? quality.check(input, e.row.id) : 0;
    const settled = settleAnswer(this.attempt(f), f.run, answer, latencyMs, now, flags);
    if (quality && settled.outcome.kind === 'completed') quality.completed(flags);
    this.deps.metrics.answered(e.row.id, latencyMs, tokens, flags);
    this.settle(settled);
  }

  private onError(f: Flight, err: unknown): void {
    const e = f.endpoint;
    if (f.abortReason) {
      this.settle(settleAbort(this.attempt(f), f.abortReason));
      return;
    }
    const verdict = classifyError(err, f.run.requestTimeoutMs);
    if (verdict.kind === 'endpoint_refused') {
      e.consecutiveFailures = 0;
      this.guard('marking an endpoint', () => this.pool.setState(e, 'starting', verdict.reason));
      // Under the server-fault budget: a refusal that only this request meets must not bounce forever.
      this.settle(settleError(this.attempt(f), this.limits(f.run), verdict.error, this.deps.clock()));
      return;
    }
    if (verdict.transport) {
      this.guard('marking an endpoint', () => this.pool.transportFailure(e, verdict.error.message) && this.abortEndpoint(e, 'release'));
    } else if (verdict.error.status !== null) {
      // The server answered: whatever the status, its connection works.
      e.consecutiveFailures = 0;
    }
    this.settle(settleError(this.attempt(f), this.limits(f.run), verdict.error, this.deps.clock()));
  }

  abort(f: Flight, reason: 'cancel' | 'release'): void {
    if (f.abortReason) return;
    f.abortReason = reason;
    f.controller.abort();
  }

  abortEndpoint(e: LiveEndpoint, reason: 'cancel' | 'release'): void {
    for (const id of e.inFlight.keys()) {
      const f = this.flights.get(id);
      if (f) this.abort(f, reason);
    }
  }
}
