import { hostname } from 'node:os';
import { endpointCacheUsage } from '../db/cache-usage.js';
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import { storeName } from '../db/client.js';
import { listEndpoints } from '../db/endpoints.js';
import { endpointCap } from '../domain/concurrency.js';
import { recentRunSampleCounts, runCountsByStatus } from '../db/runs.js';
import { deliveryCountsByStatus } from '../db/webhooks.js';
import { DELIVERY_STATUSES } from '../domain/webhooks.js';
import { FLAGS, flagBit } from '../domain/flags.js';
import { RETRY_REASONS, type RetryReason } from '../domain/sample-errors.js';
import { ANSWER_REPAIRS, type AnswerRepair } from '../domain/metrics.js';
import { samplesPerLine } from '../domain/run-settings.js';
import type { TurnedAwayReason } from '../domain/turned-away.js';
import { ENDPOINT_STATES, RUN_STATUSES, SAMPLE_STATUSES } from '../domain/statuses.js';
import type { MetricsSource, ProcessMetrics } from '../deps.js';

/** This process among the replicas of one database: the host and pid the runner lock names too. */
const REPLICA = `${hostname()}:${process.pid}`;

/** What an attempt at a webhook event came to (db/webhooks.ts DeliveryResult). */
const WEBHOOK_ATTEMPT_RESULTS = ['delivered', 'retry', 'failed'] as const;

/** A finished run keeps its sample gauges this long, so a scrape after the end still sees its final counts. */
const FINISHED_RUN_VISIBLE_MS = 3600_000;

let processMetrics: Registry | null = null;

/**
 * The process's own metrics (CPU, memory, event loop, garbage collection), collected once per
 * process: prom-client's collectors run as long as the process does, so a second server in it
 * (tests run many) shares them instead of starting more.
 */
function processRegistry(): Registry {
  if (!processMetrics) {
    processMetrics = new Registry();
    collectDefaultMetrics({ register: processMetrics });
  }
  return processMetrics;
}

/**
 * The Prometheus metrics of one regen process, in a registry of its own (several servers can share
 * a process in tests). Counters move as the runner works; gauges are read from the run counters
 * and the endpoint table at scrape time. Labels stay low-cardinality: run and endpoint ids, never
 * a sample's custom_id.
 */
export class Metrics implements ProcessMetrics {
  readonly registry = new Registry();
  private readonly requestSeconds = new Histogram({
    name: 'regen_request_duration_seconds',
    help: 'Time from sending a sample to an endpoint to its answer, for answered requests',
    labelNames: ['endpoint_id'] as const,
    buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800],
    registers: [this.registry],
  });
  private readonly completionTokens = new Counter({
    name: 'regen_completion_tokens_total',
    help: 'Completion tokens (reasoning included) the endpoints generated',
    labelNames: ['endpoint_id'] as const,
    registers: [this.registry],
  });
  private readonly retries = new Counter({
    name: 'regen_retries_total',
    help: 'Samples sent back to the queue for another attempt, by reason',
    labelNames: ['reason'] as const,
    registers: [this.registry],
  });
  private readonly repairs = new Counter({
    name: 'regen_answer_repairs_total',
    help: 'Answers kept with a part mended, by repair: a cached or reasoning token count clamped to the count it is part of, unpaired surrogates replaced by U+FFFD',
    labelNames: ['repair'] as const,
    registers: [this.registry],
  });
  private readonly sheds = new Counter({
    name: 'regen_answers_shed_total',
    help: 'Answers cut because the answers in flight passed REGEN_ANSWER_BUFFER_BYTES, by outcome: their samples given back (released), or failed as answer_too_large after being cut too often (failed)',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  });
  private readonly turnedAways = new Counter({
    name: 'regen_turned_away_total',
    help: 'Requests an endpoint turned away for a while (429, a gateway shedding bulk traffic or timing it out): their samples went back to the queue with nothing charged',
    labelNames: ['endpoint_id', 'reason'] as const,
    registers: [this.registry],
  });
  private readonly flags = new Counter({
    name: 'regen_quality_flags_total',
    help: 'Quality flags raised on answers, by flag (answers later re-asked included)',
    labelNames: ['flag'] as const,
    registers: [this.registry],
  });
  private readonly shardUploads = new Counter({
    name: 'regen_shard_uploads_total',
    help: 'Shards written to object storage, verified and marked uploaded',
    registers: [this.registry],
  });
  private readonly shardUploadFailures = new Counter({
    name: 'regen_shard_upload_failures_total',
    help: 'Shard upload attempts that failed (each is retried with backoff)',
    registers: [this.registry],
  });
  private readonly webhookAttempts = new Counter({
    name: 'regen_webhook_attempts_total',
    help: 'Webhook delivery attempts, by what came of them (retry: failed, to be tried again; failed: given up)',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });
  private readonly webhookEvents = new Gauge({
    name: 'regen_webhook_events',
    help: 'Webhook events in the outbox, by delivery status',
    labelNames: ['status'] as const,
    registers: [this.registry],
  });
  private readonly eventStreams = new Gauge({
    name: 'regen_event_streams',
    help: 'Open GET /v1/runs/{id}/events streams',
    registers: [this.registry],
  });
  private readonly runSamples = new Gauge({
    name: 'regen_run_samples',
    help: 'Samples of a live or recently finished run, by sample status',
    labelNames: ['run_id', 'status'] as const,
    registers: [this.registry],
  });
  private readonly runTurns = new Gauge({
    name: 'regen_run_turns',
    help: "A conversation run's requests (user turns and tool-call steps), as its `turns` counts them: total, completed, failed, in_flight (its samples count conversations)",
    labelNames: ['run_id', 'status'] as const,
    registers: [this.registry],
  });
  private readonly runRequests = new Gauge({
    name: 'regen_run_requests',
    help: "A run with params.n > 1: its requests, each asking for a line's n answers, as progress.requests_per_second counts them (its samples over n): total, completed, failed, in_flight",
    labelNames: ['run_id', 'status'] as const,
    registers: [this.registry],
  });
  private readonly runInFlight = new Gauge({
    name: 'regen_run_in_flight',
    help: "A live run's requests sent and not yet answered (progress.in_flight), by the processes dispatching it",
    labelNames: ['run_id'] as const,
    registers: [this.registry],
  });
  private readonly runSamplesInFlight = new Gauge({
    name: 'regen_run_samples_in_flight',
    help: 'The samples those requests answer (progress.samples_in_flight): up to n a request with params.n > 1',
    labelNames: ['run_id'] as const,
    registers: [this.registry],
  });
  // Counters read from the run's own columns at scrape time, so they survive a restart (and with
  // several replicas each exports the same figure: take their max, not their sum).
  private readonly loopsStopped = new Counter({
    name: 'regen_loops_stopped_total',
    help: 'Streamed answers cut because they looped (README "The quality gate")',
    labelNames: ['run_id', 'model'] as const,
    registers: [this.registry],
  });
  private readonly loopTokensSaved = new Counter({
    name: 'regen_loop_tokens_saved_total',
    help: "Tokens not generated because looping answers were cut: each one's max_tokens less the tokens streamed before the cut",
    labelNames: ['run_id', 'model'] as const,
    registers: [this.registry],
  });
  private readonly runTokens = {
    prompt: new Counter({
      name: 'regen_run_prompt_tokens_total',
      help: "Prompt tokens of a run's answered samples (with regen_run_cached_tokens_total, its prefix-cache hit rate)",
      labelNames: ['run_id', 'model'] as const,
      registers: [this.registry],
    }),
    completion: new Counter({
      name: 'regen_run_completion_tokens_total',
      help: "Completion tokens (reasoning included) of a run's answered samples",
      labelNames: ['run_id', 'model'] as const,
      registers: [this.registry],
    }),
    cached: new Counter({
      name: 'regen_run_cached_tokens_total',
      help: "Prompt tokens of a run's answered samples that the server read from its prefix cache",
      labelNames: ['run_id', 'model'] as const,
      registers: [this.registry],
    }),
  };
  private readonly runCount = new Gauge({
    name: 'regen_runs',
    help: 'Runs by status',
    labelNames: ['status'] as const,
    registers: [this.registry],
  });
  private readonly endpointInFlight = new Gauge({
    name: 'regen_endpoint_in_flight',
    help: 'Requests in flight on an endpoint',
    labelNames: ['endpoint_id'] as const,
    registers: [this.registry],
  });
  private readonly endpointCap = new Gauge({
    name: 'regen_endpoint_max_concurrency',
    help: 'The most requests regen keeps in flight on an endpoint',
    labelNames: ['endpoint_id'] as const,
    registers: [this.registry],
  });
  private readonly endpointState = new Gauge({
    name: 'regen_endpoint_state',
    help: '1 for the state an endpoint is in, 0 for the others',
    labelNames: ['endpoint_id', 'state'] as const,
    registers: [this.registry],
  });
  private readonly endpointCapSource = new Gauge({
    name: 'regen_endpoint_max_concurrency_source',
    help: "Always 1: where an endpoint's cap comes from (user, adaptive, server or default)",
    labelNames: ['endpoint_id', 'source'] as const,
    registers: [this.registry],
  });
  private readonly endpointTokenUsage = new Gauge({
    name: 'regen_endpoint_server_token_usage',
    help: "The server's KV token usage at its last load reading, 0 to 1",
    labelNames: ['endpoint_id'] as const,
    registers: [this.registry],
  });
  // Read from the answers' counts by endpoint at scrape time (db/cache-usage.ts): rate(cached) / rate(prompt) is the hit rate.
  private readonly endpointPromptTokens = new Counter({
    name: 'regen_endpoint_prompt_tokens_total',
    help: 'Prompt tokens of the answers an endpoint gave',
    labelNames: ['endpoint_id'] as const,
    registers: [this.registry],
  });
  private readonly endpointCachedTokens = new Counter({
    name: 'regen_endpoint_cached_tokens_total',
    help: "Prompt tokens of an endpoint's answers served from its prefix cache (their cached_tokens; 0 without --enable-cache-report)",
    labelNames: ['endpoint_id'] as const,
    registers: [this.registry],
  });
  private readonly endpointCacheHitRate = new Gauge({
    name: 'regen_endpoint_server_cache_hit_rate',
    help: "The server's own prefix-cache hit rate at its last load reading (sglang:cache_hit_rate), 0 to 1, where it says",
    labelNames: ['endpoint_id'] as const,
    registers: [this.registry],
  });
  private readonly replicaInfo = new Gauge({
    name: 'regen_replica_info',
    help:
      'Always 1: names this process (host:pid), its store (sqlite or postgresql) and its runner role (dispatching; coordinating ' +
      'on the PostgreSQL replica that also recovers, uploads and finishes runs; stopped; none without a runner). With several ' +
      'replicas, join on it to tell them apart',
    labelNames: ['replica', 'store', 'role'] as const,
    registers: [this.registry],
  });
  private readonly endpointInfo = new Gauge({
    name: 'regen_endpoint_info',
    help: 'Always 1: names an endpoint id and the model it serves',
    labelNames: ['endpoint_id', 'name', 'model'] as const,
    registers: [this.registry],
  });

  constructor() {
    processRegistry();
    for (const reason of RETRY_REASONS) this.retries.inc({ reason }, 0);
    for (const flag of FLAGS) this.flags.inc({ flag }, 0);
    for (const repair of ANSWER_REPAIRS) this.repairs.inc({ repair }, 0);
    for (const outcome of ['released', 'failed']) this.sheds.inc({ outcome }, 0);
    this.shardUploads.inc(0);
    this.shardUploadFailures.inc(0);
    for (const result of WEBHOOK_ATTEMPT_RESULTS) this.webhookAttempts.inc({ result }, 0);
  }

  /** An endpoint answered a sample; `flags` is the quality bitmask of the answer. */
  answered(endpointId: string, latencyMs: number, completionTokens: number, flags: number): void {
    this.requestSeconds.observe({ endpoint_id: endpointId }, latencyMs / 1000);
    this.completionTokens.inc({ endpoint_id: endpointId }, completionTokens);
    for (const flag of FLAGS) if (flags & flagBit(flag)) this.flags.inc({ flag });
  }

  retried(reason: RetryReason): void {
    this.retries.inc({ reason });
  }

  repaired(repair: AnswerRepair): void {
    this.repairs.inc({ repair });
  }

  shed(failed: boolean): void {
    this.sheds.inc({ outcome: failed ? 'failed' : 'released' });
  }

  turnedAway(endpointId: string, reason: TurnedAwayReason): void {
    this.turnedAways.inc({ endpoint_id: endpointId, reason });
  }

  shardUploaded(): void {
    this.shardUploads.inc();
  }

  shardUploadFailed(): void {
    this.shardUploadFailures.inc();
  }

  webhookAttempted(result: (typeof WEBHOOK_ATTEMPT_RESULTS)[number]): void {
    this.webhookAttempts.inc({ result });
  }

  /** Counts an open event stream; call the returned function when it closes. */
  streamOpened(): () => void {
    this.eventStreams.inc();
    let open = true;
    return () => {
      if (open) this.eventStreams.dec();
      open = false;
    };
  }

  /** The Prometheus text: gauges refreshed from the database and the runner, then everything rendered. */
  async render(src: MetricsSource): Promise<string> {
    await this.readRuns(src);
    await this.readEndpoints(src);
    this.replicaInfo.reset();
    this.replicaInfo.set({ replica: REPLICA, store: storeName(src.db), role: src.runner.role() ?? 'none' }, 1);
    return Registry.merge([processRegistry(), this.registry]).metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  private async readRuns({ db, now, runner }: MetricsSource): Promise<void> {
    // Everything is read before any gauge is reset, so two renders at once cannot interleave their
    // resets and increments.
    const [byStatus, outbox, recent] = await Promise.all([
      runCountsByStatus(db),
      deliveryCountsByStatus(db),
      recentRunSampleCounts(db, now - FINISHED_RUN_VISIBLE_MS),
    ]);
    this.runCount.reset();
    for (const g of [this.runSamples, this.runTurns, this.runRequests, this.runInFlight, this.runSamplesInFlight]) g.reset();
    for (const c of [this.loopsStopped, this.loopTokensSaved, this.runTokens.prompt, this.runTokens.completion, this.runTokens.cached]) c.reset();
    for (const status of RUN_STATUSES) this.runCount.set({ status }, byStatus.find((r) => r.status === status)?.n ?? 0);
    for (const status of DELIVERY_STATUSES) this.webhookEvents.set({ status }, outbox.find((r) => r.status === status)?.n ?? 0);
    for (const r of recent) {
      for (const status of SAMPLE_STATUSES) this.runSamples.set({ run_id: r.id, status }, r[status]);
      const live = runner.runProgress(r.id);
      this.runInFlight.set({ run_id: r.id }, live.in_flight ?? 0);
      this.runSamplesInFlight.set({ run_id: r.id }, live.samples_in_flight ?? live.in_flight ?? 0);
      if (r.regenerate === 'all_assistant') {
        const turns = { total: r.turnsTotal, completed: r.turnsCompleted, failed: r.turnsFailed, in_flight: live.in_flight ?? 0 };
        for (const [status, n] of Object.entries(turns)) this.runTurns.set({ run_id: r.id, status }, n);
      }
      const perLine = samplesPerLine(r.params);
      if (perLine > 1) {
        // Each request answers a line's n samples, so its counts are the samples' over n, as the
        // API's rate is (an answer asked again alone is a request of its own, not counted apart).
        const requests = { total: r.total / perLine, completed: r.completed / perLine, failed: r.failed / perLine, in_flight: live.in_flight ?? 0 };
        for (const [status, n] of Object.entries(requests)) this.runRequests.set({ run_id: r.id, status }, n);
      }
      const labels = { run_id: r.id, model: r.model };
      this.loopsStopped.inc(labels, r.loopsStopped);
      this.loopTokensSaved.inc(labels, r.loopTokensSaved);
      this.runTokens.prompt.inc(labels, r.promptTokens);
      this.runTokens.completion.inc(labels, r.completionTokens);
      this.runTokens.cached.inc(labels, r.cachedTokens);
    }
  }

  private async readEndpoints({ db, runner, defaultConcurrency }: MetricsSource): Promise<void> {
    // Read before any reset, as readRuns does.
    const [endpoints, usage] = await Promise.all([listEndpoints(db), endpointCacheUsage(db)]);
    for (const g of [this.endpointInFlight, this.endpointCap, this.endpointCapSource, this.endpointTokenUsage, this.endpointState, this.endpointInfo])
      g.reset();
    for (const g of [this.endpointPromptTokens, this.endpointCachedTokens, this.endpointCacheHitRate]) g.reset();
    for (const u of usage) {
      if (!endpoints.some((e) => e.id === u.endpointId)) continue;
      this.endpointPromptTokens.inc({ endpoint_id: u.endpointId }, u.promptTokens);
      this.endpointCachedTokens.inc({ endpoint_id: u.endpointId }, u.cachedTokens);
    }
    for (const e of endpoints) {
      const endpoint_id = e.id;
      const live = runner.endpointLive(e.id);
      this.endpointInFlight.set({ endpoint_id }, live.in_flight);
      const cap = endpointCap(e, live, defaultConcurrency);
      this.endpointCap.set({ endpoint_id }, cap.cap);
      this.endpointCapSource.set({ endpoint_id, source: cap.source }, 1);
      if (live.server.token_usage !== null) this.endpointTokenUsage.set({ endpoint_id }, live.server.token_usage);
      if (live.server.cache_hit_rate != null) this.endpointCacheHitRate.set({ endpoint_id }, live.server.cache_hit_rate);
      for (const state of ENDPOINT_STATES) this.endpointState.set({ endpoint_id, state }, e.state === state ? 1 : 0);
      this.endpointInfo.set({ endpoint_id, name: e.name ?? '', model: e.model ?? '' }, 1);
    }
  }
}
