import type { RunnerDeps } from '../deps.js';
import type { RunRow } from '../db/schema.js';
import type { Claimed } from './claim-buffer.js';
import type { EndpointPool, LiveEndpoint } from './endpoints.js';
import { APIError } from 'openai';
import { LoopWatch, stopsLoops } from '../domain/quality.js';
import { AnswerBudget, type AnswerLease, AnswerShed, heldTextBytes } from './answer-budget.js';
import type { AnswerInit } from './http-fetch.js';
import { toolNames } from '../domain/tools.js';
import type { AnswerRepair } from '../domain/metrics.js';
import { claimedConversation, settleAbort, settleAnswer, settleError, settleFailed, type Attempt, type Settled } from './outcomes.js';
import { AnswerSheds } from './answer-sheds.js';
import { type Answer, answerByteLimit, answerLimits, type AnswerLimits, askedMaxTokens, buildRequest, classifyError, tokenBudget } from './request.js';
import type { ResultWriter } from './results.js';
import type { RunQuality } from '../domain/run-quality.js';
import type { SampleError } from '../domain/sample-errors.js';
import { choiceOrder, otherChoices, requestSample, shareUsage } from './choices.js';
import { StreamedAnswer } from './stream-answer.js';
import { AnswerReader, postBuffered, streamable } from './raw-requests.js';
import { exactUsage, ID_PARAMS, type IdMode, namesIdParam, streamsIds, withIds } from './token-ids.js';
import { idRefused } from './id-probe.js';

/** Why regen aborted a request: to cancel its run, to give its sample back, or because its answer looped. */
export type AbortReason = 'cancel' | 'release' | 'loop';

export interface Flight {
  /** The samples the request answers, in choice order: one, or the pending answers of one line (params.n > 1), asked with `n`. */
  group: Claimed[];
  run: RunRow;
  endpoint: LiveEndpoint;
  controller: AbortController;
  thinking: boolean;
  /** Why regen aborted it, if it did: decides what becomes of the sample. */
  abortReason: AbortReason | null;
  /** A streamed answer as it stands, while it comes in. */
  streamed: StreamedAnswer | null;
  /** The most tokens the request may generate (tokenBudget). */
  budget: number;
  /** The max_tokens it asked, or null (an on_length retry doubles it). */
  maxTokens: number | null;
  /** What the request allows its answer (its token counts are checked against it). */
  limits: AnswerLimits;
  /** The answer's share of the memory of answers in flight. */
  lease: AnswerLease;
  /** The request carried the endpoint's `priority`: a refusal of it is the endpoint's, not the sample's. */
  sentPriority: boolean;
  /** The names of the functions the request offered (its `tools`), or null. */
  tools: Set<string> | null;
  /** How the request asked for the server's token ids (output.tokens), or null when it did not. */
  idMode: Exclude<IdMode, 'none'> | null;
  /** When it was sent (the clock's ms): a conversation forecast reads how long its requests have been out. */
  sentAt: number;
}

/**
 * The requests in flight: each sample sent to its endpoint, its answer or error turned into an
 * outcome for the result writer, and the endpoint's health and stats moved with it. Regen aborts a
 * request itself only to cancel its run or to give its sample back (shutdown, a dead endpoint, an
 * answer cut to keep the memory budget).
 */
export class Requests {
  private readonly flights = new Map<number, Flight>();
  private readonly answers: AnswerBudget;
  private readonly sheds: AnswerSheds;
  readonly reader = new AnswerReader();
  /** Per run, the requests endpoints turned away while this process dispatched it (the run page shows them). */
  readonly turnedAway = new Map<string, number>();

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
  ) {
    this.answers = new AnswerBudget(deps.config.answerBufferBytes);
    this.sheds = new AnswerSheds(deps, guard);
  }

  get size(): number {
    return this.flights.size;
  }

  all(): IterableIterator<Flight> {
    return this.flights.values();
  }

  send(e: LiveEndpoint, run: RunRow, claimed: Claimed[]): void {
    const group = choiceOrder(claimed);
    const sample = group[0];
    const { body, thinking } = buildRequest(run, requestSample(group as [Claimed, ...Claimed[]]), Math.random, group.length);
    const sentPriority = e.sendsPriority;
    if (sentPriority) body.priority = e.row.requestPriority;
    // Dispatch sends a run that writes ids only where the probe found how to ask for them (pump.ts).
    const idMode = run.outputTokens && e.idMode !== null && e.idMode !== 'none' ? e.idMode : null;
    if (idMode) Object.assign(body, ID_PARAMS[idMode]);
    const controller = new AbortController();
    const limits = answerLimits(body, e.row.maxModelLen);
    const flight: Flight = {
      group,
      run,
      endpoint: e,
      controller,
      thinking,
      abortReason: null,
      streamed: null,
      budget: tokenBudget(body, e.row.maxModelLen),
      maxTokens: askedMaxTokens(body),
      limits,
      lease: this.answers.lease(answerByteLimit(body, limits)),
      sentPriority,
      tools: toolNames(body.tools),
      idMode,
      sentAt: this.deps.clock(),
    };
    // Keyed by the first sample: one request, one slot, however many answers it asks.
    this.flights.set(sample.id, flight);
    e.inFlight.set(sample.id, controller);
    const started = flight.sentAt;
    // Streamed only when loops are to be stopped: a buffered answer costs less to read (BENCHMARKS.md).
    // A request that asks for log probabilities stays buffered: the streamed record does not gather
    // them chunk by chunk, and they are kept whole on the output line. So does one of several
    // choices (`n`): the stream's record holds one (a looping choice is flagged when it ends). So
    // does one whose ids come back only unstreamed (return_token_ids).
    const answer =
      stopsLoops(run.quality) && streamable(body) && limits.choices === 1 && streamsIds(idMode)
        ? this.stream(flight, body)
        : postBuffered(e, body, {
            signal: controller.signal,
            timeout: run.requestTimeoutMs,
            headers: e.extraHeaders,
            // The openai client hands its fetchOptions to agentFetch untouched; its type knows only RequestInit's fields.
            fetchOptions: { answerLease: flight.lease } satisfies AnswerInit as object,
          });
    answer
      .then(
        (res) => this.onResponse(flight, res, this.deps.clock() - started),
        (err) => this.onError(flight, err, this.deps.clock() - started),
      )
      .catch((err: Error) => {
        // An answer the code could not take (a database fault, say): the sample goes back to the
        // queue as a retry; the process must not die over one response.
        this.deps.logger.error({ run_id: run.id, endpoint_id: e.row.id, err: { message: err.message, stack: err.stack } }, 'could not record an answer');
        this.guard('recording an answer', () => this.onError(flight, err));
      })
      .finally(() => {
        // A shed answer's samples keep their count of sheds; any other end starts it again.
        if (!(flight.lease.refused instanceof AnswerShed)) this.sheds.settled(group.map((s) => s.id));
        flight.lease.release();
        this.flights.delete(sample.id);
        e.inFlight.delete(sample.id);
        this.hooks.settled();
      });
  }

  /**
   * Streams the answer, watching the growing tail of its content and reasoning for a loop; on one
   * the request is aborted (SGLang frees it within seconds) and settled by onLoop. Resolves with
   * the same record a buffered answer gives.
   */
  private stream(f: Flight, body: Record<string, unknown>): Promise<unknown> {
    const streamed = new StreamedAnswer();
    f.streamed = streamed;
    const content = new LoopWatch();
    const reasoning = new LoopWatch();
    return (
      f.endpoint
        .streamChat(
          { ...body, stream: true, stream_options: { include_usage: true } },
          {
            signal: f.controller.signal,
            timeoutMs: f.run.requestTimeoutMs,
            lease: f.lease,
            onData: (data) => {
              const added = streamed.add(data);
              if ('status' in added) throw APIError.generate(added.status, { error: added.error }, undefined, new Headers());
              // The text kept until the answer ends is held under the lease; a cut has already ended the request.
              if (!f.lease.take(heldTextBytes(added.content) + heldTextBytes(added.reasoning))) return;
              // Both watches see every piece: a loop in the reasoning is cut as one in the answer is.
              const looped = content.add(added.content);
              if (reasoning.add(added.reasoning) || looped) this.abort(f, 'loop');
            },
          },
        )
        // A server that answered with one JSON body, not a stream, gave the buffered answer itself.
        .then((whole) => (whole ? whole.body : streamed.response()))
    );
  }

  private attempt(f: Flight, sample: Claimed = f.group[0]): Attempt {
    const { run, endpoint } = f;
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
      quarantined: endpoint.state === 'quarantined' || endpoint.quarantining,
      variant: sample.variant ?? null,
      maxTokens: f.maxTokens,
      contextLength: f.limits.contextLength,
      conversation: claimedConversation(sample),
    };
  }

  private limits(run: RunRow): { maxAttempts: number; maxServerFaults: number; retryMs: number } {
    return { maxAttempts: run.maxAttempts, maxServerFaults: this.deps.config.maxServerFaults, retryMs: this.deps.config.requestRetryMs };
  }

  private settle({ outcome, retried }: Settled): void {
    if (retried) this.deps.metrics.retried(retried);
    this.writer.add(outcome);
  }

  private onResponse(f: Flight, res: unknown, latencyMs: number): void {
    const e = f.endpoint;
    e.consecutiveFailures = 0;
    e.yieldCap.answered(this.pool.capOf(e));
    const read = this.reader.read(f.run, res, f.limits, f.group.length, e.row.id);
    const parsed = f.idMode ? withIds(read, res, f.idMode) : read;
    if (f.abortReason && parsed.some((p) => !p.ok)) {
      this.onError(f, null);
      return;
    }
    const now = this.deps.clock();
    const answers = parsed.map((p) => (p.ok ? p.answer : null));
    const answered = answers.find((a) => a !== null);
    if (answered) {
      // One request, one usage: the fleet's speed is its tokens over its latency, all choices decoded side by side.
      const tokens = answered.usage.completion_tokens;
      e.latency.add(latencyMs);
      e.rate.add(now, 1, tokens);
      this.hooks.answered(f.run, e.row.id, tokens, latencyMs, now);
    }
    if (answered) this.sheds.answered(f.run);
    const usages = answered ? exactUsage(shareUsage(answered.usage, answers), answers) : [];
    this.countRepairs(answers);
    const quality = this.hooks.qualityOf(f.run);
    // A failed choice's backoff is its request's: the answers of a line that come back together stay together.
    const draw = Math.random();
    for (const [i, sample] of f.group.entries()) {
      const p = parsed[i];
      if (!p.ok) {
        this.settle(settleError(this.attempt(f, sample), this.limits(f.run), p.error, now, () => draw));
        continue;
      }
      // One sample asking several choices of its own (an OpenAI batch line): all kept in its answer.
      const others = f.group.length === 1 && f.limits.choices > 1 ? otherChoices(res, f.limits) : undefined;
      const answer = { ...p.answer, usage: usages[i], ...(others && { others }) };
      const tokens = answer.usage.completion_tokens;
      const input = {
        content: answer.content,
        reasoning_content: answer.reasoning,
        finish_reason: answer.finishReason,
        completion_tokens: tokens,
        thinking_requested: f.thinking,
        tool_calls: answer.toolCalls,
        tools: f.tools,
        trainable_tokens: answer.ids?.output.length ?? null,
      };
      // An embedding has no text to judge: parseEmbedding checked its values.
      const flags = quality && !answer.embedding ? quality.check({ ...input, raw: f.run.endpoint === '/v1/completions' }, e.row.id, sample.variant ?? null) : 0;
      const settled = settleAnswer(
        { ...this.attempt(f, sample), requestPromptTokens: answered?.usage.prompt_tokens ?? null },
        f.run,
        answer,
        latencyMs,
        now,
        flags,
      );
      // Every turn of a conversation counts in the quality windows, as a single answer does.
      if (quality && (settled.outcome.kind === 'completed' || settled.outcome.kind === 'turn')) quality.completed(flags, sample.variant ?? null);
      this.deps.metrics.answered(e.row.id, latencyMs, tokens, flags);
      this.settle(settled);
    }
  }

  /** A request's usage repairs count once, its choices' text repairs once each. */
  private countRepairs(answers: readonly (Answer | null)[]): void {
    const counted = new Set<AnswerRepair>();
    for (const repair of answers.flatMap((a) => a?.repairs ?? [])) {
      if (repair !== 'lone_surrogates_replaced' && counted.has(repair)) continue;
      counted.add(repair);
      this.deps.metrics.repaired(repair);
    }
  }

  /**
   * A streamed answer cut because it looped: flagged repetitive, and asked again under the
   * quality-retry rules like any flagged answer; kept as it stood when no retry is left. The
   * tokens it was spared are its budget less the tokens streamed (one an event, SGLang's default).
   */
  private onLoop(f: Flight, streamed: StreamedAnswer, latencyMs: number): void {
    const e = f.endpoint;
    e.consecutiveFailures = 0;
    const generated = streamed.textEvents;
    const { answer, repaired } = streamed.loopAnswer();
    if (repaired) this.deps.metrics.repaired('lone_surrogates_replaced');
    const quality = this.hooks.qualityOf(f.run);
    const flags = quality ? quality.cut(e.row.id) : 0;
    const settled = settleAnswer(this.attempt(f), f.run, answer, latencyMs, this.deps.clock(), flags);
    settled.outcome.loopTokensSaved = Math.max(0, f.budget - generated);
    if (quality && (settled.outcome.kind === 'completed' || settled.outcome.kind === 'turn')) quality.completed(flags, f.group[0]?.variant ?? null);
    this.deps.metrics.answered(e.row.id, latencyMs, generated, flags);
    this.settle(settled);
  }

  private onError(f: Flight, err: unknown, latencyMs = 0): void {
    const e = f.endpoint;
    if (f.abortReason === 'loop' && f.streamed) {
      this.onLoop(f, f.streamed, latencyMs);
      return;
    }
    if (f.abortReason) {
      for (const s of f.group) this.settle(settleAbort(this.attempt(f, s), f.abortReason === 'cancel' ? 'cancel' : 'release'));
      return;
    }
    // Cut to keep regen's own memory, whatever the server did: the samples are given back unspent,
    // unless their answer was cut too often already (answer-sheds.ts).
    if (f.lease.refused instanceof AnswerShed) {
      e.consecutiveFailures = 0;
      const failed = this.sheds.shed(
        f.run,
        e.row.id,
        f.group.map((s) => s.id),
      );
      const now = this.deps.clock();
      for (const s of f.group) this.settle(failed ? settleFailed(this.attempt(f, s), failed, now) : settleAbort(this.attempt(f, s), 'release'));
      return;
    }
    const verdict = classifyError(err, f.run.requestTimeoutMs, f.sentPriority, this.deps.clock());
    if (verdict.kind === 'turned_away' || verdict.kind === 'priority_refused') {
      // The server's choice, not a fault of either: the samples go back with nothing charged.
      e.consecutiveFailures = 0;
      if (verdict.kind === 'turned_away') {
        this.pool.turnedAway(e, verdict.retryAfterMs);
        this.turnedAway.set(f.run.id, (this.turnedAway.get(f.run.id) ?? 0) + 1);
        this.deps.metrics.turnedAway(e.row.id, verdict.reason);
      } else void this.guard('marking an endpoint', () => this.pool.refusePriority(e, verdict.message));
      for (const s of f.group) this.settle(settleAbort(this.attempt(f, s), 'release'));
      return;
    }
    if (verdict.kind === 'error' && f.idMode && namesIdParam(verdict.error.status, verdict.error.message)) {
      // regen asked for ids wrongly (the server changed under it): probed again, the samples back unspent.
      idRefused(e, this.deps.logger);
      for (const s of f.group) this.settle(settleAbort(this.attempt(f, s), 'release'));
      return;
    }
    if (verdict.kind === 'endpoint_refused') {
      e.consecutiveFailures = 0;
      void this.guard('marking an endpoint', () => this.pool.setState(e, 'starting', verdict.reason));
      // Under the server-fault budget: a refusal that only this request meets must not bounce forever.
      this.settleAll(f, verdict.error);
      return;
    }
    if (verdict.transport) {
      void this.guard('marking an endpoint', async () => {
        if (await this.pool.transportFailure(e, verdict.error.message)) this.abortEndpoint(e, 'release');
      });
    } else if (verdict.error.status !== null) {
      // The server answered: whatever the status, its connection works.
      e.consecutiveFailures = 0;
    }
    this.settleAll(f, verdict.error);
  }

  /** A failed request fails (or is asked again) for all its samples alike: one backoff, so a line's answers come back together. */
  private settleAll(f: Flight, error: SampleError): void {
    const now = this.deps.clock();
    const draw = Math.random();
    for (const s of f.group) this.settle(settleError(this.attempt(f, s), this.limits(f.run), error, now, () => draw));
  }

  abort(f: Flight, reason: AbortReason): void {
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
