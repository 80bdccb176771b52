import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { buildReply, parseChatRequest, streamHead, streamPiece, streamTail, type ChatRequest } from './completion.js';
import { asTextCompletion, completionAsChat, embeddingReply } from './raw.js';
import { readJson, sendDetail, sendError, sendJson, sendText, SimHttpError } from './http.js';
import { KvRank } from './kv.js';
import { renderMetrics } from './metrics.js';
import { checkKnobs, DEFAULTS, SimOptionError, type Knobs, type SimOptions } from './options.js';
import { PrefixCache } from './prefix-cache.js';
import type { PriorityPolicy } from './priority.js';
import type { Job, Rank } from './rank.js';
import { Slots } from './slots.js';
import { hashSeed, seededRandom, type Random } from './text.js';

export type { SimOptions } from './options.js';

export interface SimStats {
  /** Chat requests received, whatever became of them. */
  requests: number;
  completed: number;
  running: number;
  queued: number;
  /** The most requests ever running at once: proves a client filled the server to its cap. */
  maxRunningSeen: number;
  /** Injected 500/503 answers. */
  errors: number;
  resets: number;
  hangs: number;
  /** Turned away with "The request queue is full." */
  rejected: number;
  /** Clients that hung up while their request was queued or running. */
  aborted: number;
  /** Answers sent with finish_reason "abort". */
  aborts: number;
  /** Chat requests that asked for `stream: true`. */
  streamed: number;
  /** Chat requests that carried a `priority`, and those refused for it (refusePriority). */
  prioritized: number;
  priorityRefused: number;
  /** Chat requests sent with `x-smg-priority: bulk`. */
  bulk: number;
  /** Turned away as a gateway sheds load (turnAwayRate): 429, or 503 with X-SMG-Preempted. */
  turnedAway: number;
  /** Requests pushed back to the queue for lack of KV (KV model only). */
  retracted: number;
  /** Running requests pushed back to the queue by one of higher priority (enablePriorityScheduling). */
  preempted: number;
  /** The most KV tokens one rank's running requests ever held. */
  maxKvUsed: number;
  /** Tokens generated, those of requests whose client hung up included (sglang:generation_tokens_total). */
  generatedTokens: number;
  /** The most tokens generated for one request before its client hung up: how soon a client cut it. */
  maxTokensBeforeHangUp: number;
  /** Prompt tokens of the answered requests, and those of them the prefix cache served. */
  promptTokens: number;
  cachedTokens: number;
  /** `/health` answers sent, and `/health` requests being answered now: whether a client's probe is still in flight. */
  healthChecks: number;
  healthRunning: number;
}

export interface Simulator {
  url: string;
  port: number;
  close(): Promise<void>;
  /** What SIGTERM does: /health answers 503, running and queued requests finish, then the server closes. */
  drain(): Promise<void>;
  stats(): SimStats;
  configure(patch: Partial<SimOptions>): void;
}

/** The SGLang release docs/sglang.md was read from. */
const SGLANG_VERSION = '0.5.17';
const MAX_BODY_BYTES = 32 * 1024 * 1024;

// How often a paced stream sends the tokens due: SGLang sends one event a decode step; the
// simulator batches the steps of 10 ms into one write, so a timer a token is not needed.
const STREAM_TICK_MS = 10;

const STARTING = 'The server is starting: model weights are still loading.';

// Every route the simulator serves, so that a known path with the wrong method is a 405, as in FastAPI.
const ROUTES = new Map<string, string>([
  ['/v1/chat/completions', 'POST'],
  ['/v1/completions', 'POST'],
  ['/v1/embeddings', 'POST'],
  ['/health', 'GET'],
  ['/health_generate', 'GET'],
  ['/v1/models', 'GET'],
  ['/server_info', 'GET'],
  ['/get_server_info', 'GET'],
  ['/model_info', 'GET'],
  ['/get_model_info', 'GET'],
  ['/v1/loads', 'GET'],
  ['/get_load', 'GET'],
  ['/metrics', 'GET'],
  ['/sim/stats', 'GET'],
  ['/sim/config', 'POST'],
]);

interface Faults {
  reset: boolean;
  hang: boolean;
  error: 500 | 503 | undefined;
  degenerate: boolean;
  abortAt: number | undefined;
  skewIds: boolean;
}

interface RankCache {
  promptTokens: number;
  cachedTokens: number;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms).unref());

class SimServer {
  readonly http: Server;
  readonly #knobs: Knobs;
  /** Knobs given at start: SGLang reports a CLI value only when it was given. */
  readonly #given: ReadonlySet<string>;
  readonly #ranks: Rank[];
  readonly #cache: RankCache[];
  /** Each rank's radix cache, in the KV pool its running requests leave free. */
  readonly #prefixes: PrefixCache[];
  readonly #onDie: () => void;
  readonly #startedAt = Date.now();
  /** Chat requests past holdAfter, each with its arrival count, waiting to be let go. */
  #held: { count: number; resolve: () => void }[] = [];
  #random: Random;
  // Its own stream, so that turning aborts on leaves the other faults' sequence as it was.
  #abortRandom: Random;
  // Its own stream too, for tokenIdMismatchRate.
  #idRandom: Random;
  // The same for the gateway's turn-aways.
  #turnAwayRandom: Random;
  readonly #counts = {
    requests: 0,
    completed: 0,
    errors: 0,
    resets: 0,
    hangs: 0,
    rejected: 0,
    aborted: 0,
    aborts: 0,
    streamed: 0,
    healthChecks: 0,
    prioritized: 0,
    priorityRefused: 0,
    bulk: 0,
    turnedAway: 0,
  };
  #healthRunning = 0;
  #maxRunningSeen = 0;
  #promptTokens = 0;
  #generationTokens = 0;
  #maxTokensBeforeHangUp = 0;
  #draining = false;
  #onDrained: (() => void) | undefined;

  constructor(knobs: Knobs, given: ReadonlySet<string>, onDie: (() => void) | undefined) {
    this.#knobs = knobs;
    this.#given = given;
    this.#random = seededRandom(knobs.seed);
    this.#abortRandom = seededRandom(hashSeed(`${knobs.seed}:abort`));
    this.#idRandom = seededRandom(hashSeed(`${knobs.seed}:ids`));
    this.#turnAwayRandom = seededRandom(hashSeed(`${knobs.seed}:turn-away`));
    const onStart = (): void => {
      this.#maxRunningSeen = Math.max(
        this.#maxRunningSeen,
        this.#sum((rank) => rank.running),
      );
    };
    this.#ranks = Array.from({ length: knobs.dpSize }, (_, i) =>
      knobs.kvTokens > 0
        ? new KvRank(knobs, () => this.#share(i), onStart)
        : new Slots(
            () => this.#share(i),
            onStart,
            () => this.#priorityPolicy(),
          ),
    );
    this.#cache = this.#ranks.map(() => ({ promptTokens: 0, cachedTokens: 0 }));
    this.#prefixes = this.#ranks.map((rank, i) => new PrefixCache(() => this.#pool(i) - rank.usedTokens));
    this.#onDie = onDie ?? (() => this.#dropEverything());
    this.http = createServer({ keepAliveTimeout: knobs.keepAliveMs }, (req, res) => {
      this.#route(req, res).catch((error: unknown) => this.#fail(res, error));
    });
  }

  stats(): SimStats {
    return {
      ...this.#counts,
      healthRunning: this.#healthRunning,
      running: this.#sum((rank) => rank.running),
      queued: this.#sum((rank) => rank.queued),
      maxRunningSeen: this.#maxRunningSeen,
      retracted: this.#sum((rank) => rank.retractions),
      preempted: this.#sum((rank) => rank.preemptions),
      maxKvUsed: Math.max(...this.#ranks.map((rank) => rank.maxUsedTokens)),
      generatedTokens: this.#generationTokens,
      maxTokensBeforeHangUp: this.#maxTokensBeforeHangUp,
      promptTokens: this.#promptTokens,
      cachedTokens: this.#cache.reduce((sum, c) => sum + c.cachedTokens, 0),
    };
  }

  configure(patch: unknown): Knobs {
    const checked = checkKnobs(patch, 'runtime');
    Object.assign(this.#knobs, checked);
    if (checked.seed !== undefined) {
      this.#random = seededRandom(checked.seed);
      this.#abortRandom = seededRandom(hashSeed(`${checked.seed}:abort`));
      this.#idRandom = seededRandom(hashSeed(`${checked.seed}:ids`));
      this.#turnAwayRandom = seededRandom(hashSeed(`${checked.seed}:turn-away`));
    }
    if (checked.keepAliveMs !== undefined) this.http.keepAliveTimeout = checked.keepAliveMs;
    const held = this.#held;
    this.#held = held.filter((h) => this.#heldBack(h.count));
    for (const h of held) if (!this.#heldBack(h.count)) h.resolve();
    // A raised maxRunning should take queued requests now, not when the next one finishes.
    for (const rank of this.#ranks) rank.refill();
    return { ...this.#knobs };
  }

  drain(): Promise<void> {
    this.#draining = true;
    return new Promise((resolve) => {
      this.#onDrained = resolve;
      this.#checkDrained();
    });
  }

  closeRanks(): void {
    for (const rank of this.#ranks) rank.close();
  }

  #sum(of: (rank: Rank) => number): number {
    let total = 0;
    for (const rank of this.#ranks) total += of(rank);
    return total;
  }

  #checkDrained(): void {
    if (!this.#onDrained || this.#sum((rank) => rank.running + rank.queued) > 0) return;
    const resolve = this.#onDrained;
    this.#onDrained = undefined;
    resolve();
  }

  /** How the ranks order by priority, read at every decision so that a runtime change applies at once; null when off. */
  #priorityPolicy(): PriorityPolicy | null {
    const k = this.#knobs;
    if (k.enablePriorityScheduling !== 1) return null;
    return {
      lowFirst: k.scheduleLowPriorityValuesFirst === 1,
      defaultValue: k.defaultPriorityValue,
      threshold: k.prioritySchedulingPreemptionThreshold,
      preemption: k.disablePriorityPreemption !== 1,
    };
  }

  /** Rank i's running limit: maxRunning split as evenly as it goes, and at least one. */
  #share(i: number): number {
    const { maxRunning, dpSize } = this.#knobs;
    return Math.max(1, Math.floor(maxRunning / dpSize) + (i < maxRunning % dpSize ? 1 : 0));
  }

  /** Rank i's KV pool in tokens. */
  #pool(i: number): number {
    // Without a KV model every running request fits at full context.
    return this.#knobs.kvTokens > 0 ? this.#knobs.kvTokens : this.#share(i) * this.#knobs.contextLength;
  }

  #dropEverything(): void {
    this.http.close();
    this.http.closeAllConnections();
  }

  #heldBack(count: number): boolean {
    return this.#knobs.holdAfter > 0 && count > this.#knobs.holdAfter;
  }

  #starting(): boolean {
    return Date.now() - this.#startedAt < this.#knobs.startupMs;
  }

  #requireStarted(): void {
    if (this.#starting()) throw new SimHttpError(503, STARTING);
  }

  async #route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const [path, query = ''] = (req.url ?? '/').split('?', 2);
    switch (`${req.method} ${path}`) {
      case 'POST /v1/chat/completions':
        return this.#chat(req, res);
      case 'POST /v1/completions':
        return this.#chat(req, res, true);
      case 'POST /v1/embeddings':
        this.#counts.requests++;
        this.#requireStarted();
        this.#counts.completed++;
        return sendJson(res, 200, embeddingReply(await readJson(req, MAX_BODY_BYTES), this.#knobs));
      case 'GET /health':
      case 'GET /health_generate':
        return this.#health(res);
      case 'GET /v1/models':
        this.#requireStarted();
        return sendJson(res, 200, this.#models());
      case 'GET /server_info':
      case 'GET /get_server_info':
        this.#requireStarted();
        return sendJson(res, 200, this.#serverInfo());
      case 'GET /model_info':
      case 'GET /get_model_info':
        this.#requireStarted();
        return sendJson(res, 200, this.#modelInfo());
      case 'GET /v1/loads':
        this.#requireStarted();
        return sendJson(res, 200, this.#loads(new URLSearchParams(query)));
      case 'GET /get_load':
        this.#requireStarted();
        return sendJson(res, 200, this.#legacyLoad());
      case 'GET /metrics':
        if (this.#knobs.enableMetrics !== 1) return sendDetail(res, 404, 'Not Found');
        return sendText(res, 200, this.#metrics(), 'text/plain; version=0.0.4');
      case 'GET /sim/stats':
        return sendJson(res, 200, this.stats());
      case 'POST /sim/config':
        return sendJson(res, 200, this.configure(await readJson(req, MAX_BODY_BYTES)));
      default:
        if (ROUTES.has(path)) return sendDetail(res, 405, 'Method Not Allowed');
        return sendDetail(res, 404, 'Not Found');
    }
  }

  #fail(res: ServerResponse, error: unknown): void {
    if (res.headersSent || res.destroyed) {
      res.destroy();
    } else if (error instanceof SimHttpError) {
      sendError(res, error.status, error.message, error.type);
    } else if (error instanceof SimOptionError) {
      sendError(res, 400, error.message);
    } else {
      sendError(res, 500, `Internal server error: ${error instanceof Error ? error.message : String(error)}`);
    }
  }

  // Real SGLang generates one token for a healthy answer, so even an idle server takes about a second.
  async #health(res: ServerResponse): Promise<void> {
    this.#healthRunning++;
    if (!this.#starting() && this.#knobs.healthMs > 0) await sleep(this.#knobs.healthMs);
    const healthy = !this.#starting() && !this.#draining;
    res.writeHead(healthy ? 200 : 503, { 'content-length': 0 }).end();
    this.#healthRunning--;
    this.#counts.healthChecks++;
  }

  #models(): object {
    const { model, contextLength } = this.#knobs;
    const created = Math.floor(this.#startedAt / 1000);
    return {
      object: 'list',
      data: [{ id: model, object: 'model', created, owned_by: 'sglang', root: model, max_model_len: contextLength }],
    };
  }

  #modelInfo(): object {
    const { model } = this.#knobs;
    return { model_path: model, tokenizer_path: model, is_generation: true, weight_version: 'default' };
  }

  // A few of SGLang's server_args (all given as null when not on the command line), the
  // scheduler's KV pool, and one internal state per DP rank.
  #serverInfo(): object {
    const k = this.#knobs;
    return {
      model_path: k.model,
      tokenizer_path: k.model,
      served_model_name: k.model,
      context_length: this.#given.has('contextLength') ? k.contextLength : null,
      max_running_requests: k.maxRunningRequests > 0 ? k.maxRunningRequests : null,
      max_queued_requests: k.maxQueue,
      tp_size: 1,
      dp_size: k.dpSize,
      enable_metrics: k.enableMetrics === 1,
      enable_cache_report: k.enableCacheReport === 1,
      reasoning_parser: k.reasoningParser === 1 ? 'qwen3' : null,
      tool_call_parser: k.toolCallParser === 1 ? 'qwen25' : null,
      max_total_num_tokens: this.#pool(0),
      max_req_input_len: Math.min(k.contextLength, this.#pool(0)) - 1,
      startup_time: this.#startedAt / 1000,
      internal_states: this.#ranks.map((rank, i) => ({
        last_gen_throughput: rank.genThroughput(),
        // The simulator has no GPU: only the token capacity is meaningful.
        memory_usage: { weight: 0, kvcache: 0, token_capacity: this.#pool(i), graph: 0 },
        effective_max_running_requests_per_dp: this.#share(i),
      })),
      version: SGLANG_VERSION,
    };
  }

  #rankLoad(i: number): {
    dp_rank: number;
    num_running_reqs: number;
    num_waiting_reqs: number;
    num_used_tokens: number;
    max_total_num_tokens: number;
    token_usage: number;
    gen_throughput: number;
    cache_hit_rate: number;
    utilization: number;
    max_running_requests: number;
    num_total_reqs: number;
  } {
    const rank = this.#ranks[i];
    const cache = this.#cache[i];
    return {
      dp_rank: i,
      num_running_reqs: rank.running,
      num_waiting_reqs: rank.queued,
      num_used_tokens: rank.usedTokens,
      max_total_num_tokens: this.#pool(i),
      token_usage: rank.usedTokens / this.#pool(i),
      gen_throughput: rank.genThroughput(),
      cache_hit_rate: cache.promptTokens > 0 ? cache.cachedTokens / cache.promptTokens : 0,
      // The share of the rank's running slots in use.
      utilization: rank.running / this.#share(i),
      max_running_requests: this.#share(i),
      num_total_reqs: rank.running + rank.queued,
    };
  }

  // entrypoints/v1_loads.py: the `core` fields per rank (the optional sections have nothing to show here) and their aggregate.
  #loads(query: URLSearchParams): object {
    const only = query.get('dp_rank');
    const loads = this.#ranks.map((_, i) => this.#rankLoad(i)).filter((load) => only === null || String(load.dp_rank) === only);
    const n = Math.max(1, loads.length);
    const total = (of: (load: (typeof loads)[number]) => number): number => loads.reduce((sum, load) => sum + of(load), 0);
    return {
      timestamp: new Date().toISOString(),
      version: SGLANG_VERSION,
      dp_rank_count: loads.length,
      loads,
      aggregate: {
        total_running_reqs: total((l) => l.num_running_reqs),
        total_waiting_reqs: total((l) => l.num_waiting_reqs),
        total_reqs: total((l) => l.num_total_reqs),
        avg_token_usage: Number((total((l) => l.token_usage) / n).toFixed(4)),
        avg_throughput: Number((total((l) => l.gen_throughput) / n).toFixed(2)),
        avg_utilization: Number((total((l) => l.utilization) / n).toFixed(4)),
      },
    };
  }

  // The deprecated /get_load shim's shape.
  #legacyLoad(): object {
    return this.#ranks.map((rank, i) => ({
      dp_rank: i,
      num_reqs: rank.running + rank.queued,
      num_waiting_reqs: rank.queued,
      num_tokens: rank.usedTokens,
      num_pending_tokens: 0,
      ts_tic: performance.now() / 1000,
    }));
  }

  #metrics(): string {
    return renderMetrics({
      model: this.#knobs.model,
      dataParallel: this.#knobs.dpSize > 1,
      ranks: this.#ranks.map((_, i) => {
        const load = this.#rankLoad(i);
        return {
          running: load.num_running_reqs,
          queued: load.num_waiting_reqs,
          tokenUsage: load.token_usage,
          genThroughput: load.gen_throughput,
          cacheHitRate: load.cache_hit_rate,
          retractedWaiting: this.#ranks[i].retractedWaiting,
          retractions: this.#ranks[i].retractions,
        };
      }),
      promptTokens: this.#promptTokens,
      generationTokens: this.#generationTokens,
    });
  }

  /** A chat completion, or (`completion`) a raw prompt's completion, answered the same way and shaped as a text_completion. */
  async #chat(req: IncomingMessage, res: ServerResponse, completion = false): Promise<void> {
    const count = ++this.#counts.requests;
    if (this.#knobs.dieAfter > 0 && count >= this.#knobs.dieAfter) return this.#onDie();
    if (this.#heldBack(count)) {
      await new Promise<void>((resolve) => this.#held.push({ count, resolve }));
      // Its client left while it was held: nothing is left to read or answer.
      if (req.destroyed) return;
    }
    this.#requireStarted();
    const body = await readJson(req, MAX_BODY_BYTES);
    const raw = completion ? completionAsChat(body) : null;
    const request = parseChatRequest(raw ? raw.chat : body, this.#knobs);
    const shape = raw ? (b: Record<string, unknown>) => asTextCompletion(b, raw.echo) : null;
    if (request.stream) this.#counts.streamed++;
    if (this.#turnedAway(request, req, res)) return;
    const faults = this.#drawFaults();
    if (faults.reset) {
      this.#counts.resets++;
      req.socket.destroy();
    } else if (faults.error === 500) {
      this.#counts.errors++;
      sendError(res, 500, 'Internal server error');
    } else if (faults.error === 503) {
      this.#counts.errors++;
      sendError(res, 503, 'Service temporarily unavailable');
    } else {
      if (faults.hang) this.#counts.hangs++;
      this.#schedule(request, faults, res, shape);
    }
  }

  /** A priority refused (refusePriority), or the gateway's shedding (turnAwayRate): answered here, true. */
  #turnedAway(request: ChatRequest, req: IncomingMessage, res: ServerResponse): boolean {
    const k = this.#knobs;
    const bulk = req.headers['x-smg-priority'] === 'bulk';
    if (bulk) this.#counts.bulk++;
    if (request.priority !== null) {
      this.#counts.prioritized++;
      if (k.refusePriority) {
        this.#counts.priorityRefused++;
        sendError(res, 400, 'Priority scheduling is not enabled.');
        return true;
      }
    }
    if (!(this.#turnAwayRandom() < k.turnAwayRate)) return false;
    this.#counts.turnedAway++;
    const retryAfter = k.retryAfterSeconds > 0 ? { 'retry-after': String(k.retryAfterSeconds) } : {};
    if (bulk) sendJson(res, 503, { error: { message: 'bulk request preempted' } }, { 'x-smg-preempted': 'true', ...retryAfter });
    else sendJson(res, 429, { error: { message: 'Too Many Requests' } }, retryAfter);
    return true;
  }

  // Every knob draws on every request, so changing one rate leaves the others' sequence as it was.
  #drawFaults(): Faults {
    const k = this.#knobs;
    const next = this.#random;
    const reset = next() < k.resetRate;
    const hang = next() < k.hangRate;
    const error = next() < k.errorRate;
    const error500 = next() < 0.5;
    const degenerate = next() < k.degenerateRate;
    const abort = this.#abortRandom() < k.abortRate;
    // Half of the aborts come back empty, as most do on a real server; the rest part-way through.
    const abortShare = Math.max(0, this.#abortRandom() * 2 - 1);
    const skewIds = this.#idRandom() < k.tokenIdMismatchRate;
    return { reset, hang, error: error ? (error500 ? 500 : 503) : undefined, degenerate, abortAt: abort ? abortShare : undefined, skewIds };
  }

  // SGLang's DP controller sends each request to the least loaded rank.
  #pickRank(): number {
    let best = 0;
    for (let i = 1; i < this.#ranks.length; i++) {
      const load = this.#ranks[i].running + this.#ranks[i].queued;
      if (load < this.#ranks[best].running + this.#ranks[best].queued) best = i;
    }
    return best;
  }

  #schedule(request: ChatRequest, faults: Faults, res: ServerResponse, shape: ((body: Record<string, unknown>) => unknown) | null = null): void {
    const index = this.#pickRank();
    const rank = this.#ranks[index];
    const prefix = this.#prefixes[index];
    // The matched path is held while the request lives; once it runs, its whole prompt is.
    const matched = prefix.match(request.sequence);
    let held = matched.node;
    prefix.lock(held);
    const release = (sequence: number[] | null): void => {
      if (sequence) prefix.insert(sequence);
      prefix.unlock(held);
    };
    // SGLang always computes the prompt's last token again, even on a full match.
    const cachedTokens = Math.max(0, Math.min(matched.length, request.promptTokens - 1));
    const reply = buildReply(request, this.#knobs, { degenerate: faults.degenerate, cachedTokens, abortAt: faults.abortAt, skewIds: faults.skewIds });
    const kv = this.#knobs.kvTokens > 0;
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    // When the job would have started had it run without a break: a preempted job goes on from where it stopped.
    let startedAt: number | undefined;
    // How long it had run when it was last preempted.
    let ranMs = 0;
    // Tokens of a streamed reply sent so far: what the server generated before a client hung up.
    let sent = 0;
    let headSent = false;
    // How long the request waited for a slot before it first ran: a load generator's wait, read from `x-sim-queued-ms`.
    const enteredAt = performance.now();
    let queuedMs = 0;
    const done = (): void => {
      settled = true;
      if (faults.abortAt === undefined) this.#counts.completed++;
      else this.#counts.aborts++;
      this.#promptTokens += request.promptTokens;
      this.#generationTokens += reply.completionTokens;
      this.#cache[index].promptTokens += request.promptTokens;
      this.#cache[index].cachedTokens += cachedTokens;
      // A finished request leaves its prompt and what it generated in the tree.
      release(request.sequence.concat(reply.generated));
      if (!kv) rank.leave(job);
      this.#checkDrained();
    };
    const answer = (): void => {
      sendJson(res, 200, shape ? shape(reply.body as unknown as Record<string, unknown>) : reply.body, {
        'x-sim-digest': request.digest,
        'x-sim-queued-ms': queuedMs.toFixed(1),
      });
      done();
    };
    // Paced at tokensPerSecond from the first token; unpaced (all at once) at zero latency and in the KV model, which times decode itself.
    const stream = (paced: boolean): void => {
      if (!headSent) {
        headSent = true;
        res.writeHead(200, {
          'content-type': 'text/event-stream',
          'cache-control': 'no-cache',
          'x-sim-digest': request.digest,
          'x-sim-queued-ms': queuedMs.toFixed(1),
        });
        res.write(streamHead(reply));
      }
      const { tokensPerSecond } = this.#knobs;
      // Pacing resumes from the pieces already sent (all of them, at once, after a preemption when unpaced).
      const first = performance.now() - (paced && tokensPerSecond > 0 ? (sent / (tokensPerSecond * request.n)) * 1000 : 0);
      const step = (): void => {
        const due =
          paced && tokensPerSecond > 0
            ? // The n choices' pieces are interleaved and decode side by side: n pieces a token's time.
              Math.min(reply.pieces.length, Math.floor(((performance.now() - first) / 1000) * tokensPerSecond * request.n))
            : reply.pieces.length;
        let events = '';
        while (sent < due) events += streamPiece(reply, reply.pieces[sent++]);
        if (sent < reply.pieces.length) {
          if (events) res.write(events);
          timer = setTimeout(step, STREAM_TICK_MS);
        } else {
          res.end(events + streamTail(reply, request.includeUsage));
          done();
        }
      };
      step();
    };
    const job: Job = {
      promptTokens: request.promptTokens,
      cachedTokens,
      // A hung request in the KV model leaves the batch at once and is never answered.
      completionTokens: faults.hang && kv ? 0 : reply.completionTokens,
      maxNewTokens: request.maxTokens,
      priority: request.priority,
      start: () => {
        if (startedAt === undefined) {
          queuedMs = performance.now() - enteredAt;
          const running = prefix.insert(request.sequence);
          prefix.lock(running);
          prefix.unlock(held);
          held = running;
        }
        // A hung request holds its slot until the client gives up, as a stuck server would.
        if (kv || faults.hang) return;
        startedAt = performance.now() - ranMs;
        if (request.stream) {
          const wait = this.#knobs.ttftMs - ranMs;
          if (wait <= 0) stream(true);
          else timer = setTimeout(() => stream(true), wait);
          return;
        }
        const delay = this.#latencyMs(reply.decodeTokens) - ranMs;
        // No timer at zero latency: benchmarks need the fastest possible path.
        if (delay <= 0) answer();
        else timer = setTimeout(answer, delay);
      },
      // SGLang frees a preempted request's KV and queues it again; the client only waits longer.
      preempt: () => {
        clearTimeout(timer);
        if (startedAt !== undefined) ranMs = performance.now() - startedAt;
      },
      // The KV model times prefill and decode itself; ttftMs is then a fixed delay on top.
      finish: () => {
        if (faults.hang || settled) return;
        const send = request.stream ? () => stream(false) : answer;
        if (this.#knobs.ttftMs > 0) timer = setTimeout(send, this.#knobs.ttftMs);
        else send();
      },
    };
    res.on('close', () => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      this.#counts.aborted++;
      // A streamed reply counts what it sent; a buffered one what its timing says was generated.
      const generated = request.stream ? sent : this.#generatedSince(startedAt, reply.decodeTokens) * request.n;
      this.#generationTokens += generated;
      this.#maxTokensBeforeHangUp = Math.max(this.#maxTokensBeforeHangUp, generated);
      release(null);
      rank.leave(job);
      this.#checkDrained();
    });
    if (this.#sum((r) => r.queued) >= this.#knobs.maxQueue && !rank.hasRoomFor(job)) {
      settled = true;
      release(null);
      this.#counts.rejected++;
      sendError(res, 503, 'The request queue is full.');
      return;
    }
    rank.enter(job);
  }

  /** Tokens a buffered reply had generated when its client hung up, by the timing knobs; 0 before it started or when generation is instant. */
  #generatedSince(startedAt: number | undefined, completionTokens: number): number {
    const { ttftMs, tokensPerSecond } = this.#knobs;
    if (startedAt === undefined || tokensPerSecond === 0) return 0;
    const decodingMs = performance.now() - startedAt - ttftMs;
    return Math.max(0, Math.min(completionTokens, Math.floor((decodingMs / 1000) * tokensPerSecond)));
  }

  #latencyMs(completionTokens: number): number {
    const { ttftMs, tokensPerSecond } = this.#knobs;
    return ttftMs + (tokensPerSecond > 0 ? (completionTokens / tokensPerSecond) * 1000 : 0);
  }
}

/** Starts an SGLang look-alike on `host:port` (127.0.0.1 and a free port by default). */
export async function startSimulator(opts: SimOptions = {}): Promise<Simulator> {
  const { onDie, onDrained, ...options } = opts;
  const checked = checkKnobs(options, 'start');
  const knobs: Knobs = { ...DEFAULTS, ...checked };
  const sim = new SimServer(knobs, new Set(Object.keys(checked)), onDie);
  await new Promise<void>((resolve, reject) => {
    sim.http.once('error', reject);
    sim.http.listen(knobs.port, knobs.host, () => {
      sim.http.off('error', reject);
      resolve();
    });
  });
  const { port } = sim.http.address() as AddressInfo;
  const host = knobs.host.includes(':') ? `[${knobs.host}]` : knobs.host;
  // Destroying every socket (idle keep-alive and hung requests included) is what lets tests end promptly.
  const close = (): Promise<void> =>
    new Promise<void>((resolve) => {
      sim.closeRanks();
      sim.http.close(() => resolve());
      sim.http.closeAllConnections();
    });
  return {
    url: `http://${host}:${port}`,
    port,
    stats: () => sim.stats(),
    configure: (patch) => {
      sim.configure(patch);
    },
    drain: async () => {
      await sim.drain();
      // What the server saw, before it goes: a drain test reads it from the process's last line.
      onDrained?.(sim.stats());
      await close();
    },
    close,
  };
}
