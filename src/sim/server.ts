import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { buildReply, parseChatRequest, type ChatRequest, type Reply } from './completion.js';
import { readJson, sendError, sendJson, sendText, SimHttpError } from './http.js';
import { renderMetrics } from './metrics.js';
import { checkKnobs, DEFAULTS, SimOptionError, type Knobs, type SimOptions } from './options.js';
import { Slots, type Job } from './slots.js';
import { seededRandom, type Random } from './text.js';

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
}

export interface Simulator {
  url: string;
  port: number;
  close(): Promise<void>;
  stats(): SimStats;
  configure(patch: Partial<SimOptions>): void;
}

const MAX_BODY_BYTES = 32 * 1024 * 1024;
// Bounds the prefix-cache bookkeeping during long benchmarks; forgetting everything is what a full cache does.
const SEEN_DIGESTS_LIMIT = 100_000;
// Longer than any client's idle keep-alive, so the server never closes a socket the client is reusing.
const KEEP_ALIVE_MS = 65_000;

const STARTING = 'The server is starting: model weights are still loading.';

interface Faults {
  reset: boolean;
  hang: boolean;
  error: 500 | 503 | undefined;
  degenerate: boolean;
}

class SimServer {
  readonly http: Server;
  readonly #knobs: Knobs;
  readonly #slots: Slots;
  readonly #onDie: () => void;
  readonly #startedAt = Date.now();
  readonly #seenDigests = new Set<string>();
  #random: Random;
  readonly #counts = { requests: 0, completed: 0, errors: 0, resets: 0, hangs: 0, rejected: 0, aborted: 0 };
  #promptTokens = 0;
  #generationTokens = 0;

  constructor(knobs: Knobs, onDie: (() => void) | undefined) {
    this.#knobs = knobs;
    this.#slots = new Slots(knobs);
    this.#random = seededRandom(knobs.seed);
    this.#onDie = onDie ?? (() => this.#dropEverything());
    this.http = createServer({ keepAliveTimeout: KEEP_ALIVE_MS }, (req, res) => {
      this.#route(req, res).catch((error: unknown) => this.#fail(res, error));
    });
  }

  stats(): SimStats {
    return {
      ...this.#counts,
      running: this.#slots.running,
      queued: this.#slots.queued,
      maxRunningSeen: this.#slots.maxRunningSeen,
    };
  }

  configure(patch: unknown): Knobs {
    const checked = checkKnobs(patch, 'runtime');
    Object.assign(this.#knobs, checked);
    if (checked.seed !== undefined) this.#random = seededRandom(checked.seed);
    // A raised maxRunning should take queued requests now, not when the next one finishes.
    this.#slots.refill();
    return { ...this.#knobs };
  }

  #dropEverything(): void {
    this.http.close();
    this.http.closeAllConnections();
  }

  #starting(): boolean {
    return Date.now() - this.#startedAt < this.#knobs.startupMs;
  }

  #requireStarted(): void {
    if (this.#starting()) throw new SimHttpError(503, STARTING);
  }

  async #route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?', 1)[0];
    switch (`${req.method} ${path}`) {
      case 'POST /v1/chat/completions':
        return this.#chat(req, res);
      case 'GET /health':
      case 'GET /health_generate':
        res.writeHead(this.#starting() ? 503 : 200, { 'content-length': 0 }).end();
        return;
      case 'GET /v1/models':
        this.#requireStarted();
        return sendJson(res, 200, this.#models());
      case 'GET /get_server_info':
        this.#requireStarted();
        return sendJson(res, 200, this.#serverInfo());
      case 'GET /metrics':
        return sendText(res, 200, this.#metrics(), 'text/plain; version=0.0.4');
      case 'GET /sim/stats':
        return sendJson(res, 200, this.stats());
      case 'POST /sim/config':
        return sendJson(res, 200, this.configure(await readJson(req, MAX_BODY_BYTES)));
      default:
        throw new SimHttpError(404, `Not found: ${req.method} ${path}`);
    }
  }

  #fail(res: ServerResponse, error: unknown): void {
    if (res.headersSent || res.destroyed) {
      res.destroy();
    } else if (error instanceof SimHttpError) {
      sendError(res, error.status, error.message);
    } else if (error instanceof SimOptionError) {
      sendError(res, 400, error.message);
    } else {
      sendError(res, 500, `Simulator error: ${error instanceof Error ? error.message : String(error)}`);
    }
  }

  #models(): object {
    const { model, contextLength } = this.#knobs;
    const created = Math.floor(this.#startedAt / 1000);
    return {
      object: 'list',
      data: [{ id: model, object: 'model', created, owned_by: 'sglang', root: model, max_model_len: contextLength }],
    };
  }

  #serverInfo(): object {
    const { model, contextLength, maxRunning, maxQueue } = this.#knobs;
    return {
      model_path: model,
      served_model_name: model,
      context_length: contextLength,
      max_running_requests: maxRunning,
      max_queued_requests: maxQueue,
      // Room for every running request at full context.
      max_total_num_tokens: maxRunning * contextLength,
      version: 'sim',
    };
  }

  #metrics(): string {
    return renderMetrics(this.#knobs.model, {
      running: this.#slots.running,
      queued: this.#slots.queued,
      promptTokens: this.#promptTokens,
      generationTokens: this.#generationTokens,
    });
  }

  async #chat(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const count = ++this.#counts.requests;
    if (this.#knobs.dieAfter > 0 && count >= this.#knobs.dieAfter) return this.#onDie();
    this.#requireStarted();
    const request = parseChatRequest(await readJson(req, MAX_BODY_BYTES), this.#knobs);
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
      this.#schedule(request, faults, res);
    }
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
    return { reset, hang, error: error ? (error500 ? 500 : 503) : undefined, degenerate };
  }

  #schedule(request: ChatRequest, faults: Faults, res: ServerResponse): void {
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    const answer = (reply: Reply): void => {
      settled = true;
      this.#counts.completed++;
      this.#promptTokens += request.promptTokens;
      this.#generationTokens += reply.completionTokens;
      sendJson(res, 200, reply.body, { 'x-sim-digest': request.digest });
      this.#slots.leave(job);
    };
    const job: Job = {
      start: () => {
        // A hung request holds its slot until the client gives up, as a stuck server would.
        if (faults.hang) return;
        const cachedTokens = this.#cachedTokens(request);
        const reply = buildReply(request, this.#knobs, { degenerate: faults.degenerate, cachedTokens });
        const delay = this.#latencyMs(reply.completionTokens);
        // No timer at zero latency: benchmarks need the fastest possible path.
        if (delay === 0) answer(reply);
        else timer = setTimeout(answer, delay, reply);
      },
    };
    res.on('close', () => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      this.#counts.aborted++;
      this.#slots.leave(job);
    });
    if (!this.#slots.enter(job)) {
      settled = true;
      this.#counts.rejected++;
      sendError(res, 503, 'The request queue is full.');
    }
  }

  #latencyMs(completionTokens: number): number {
    const { ttftMs, tokensPerSecond } = this.#knobs;
    return ttftMs + (tokensPerSecond > 0 ? (completionTokens / tokensPerSecond) * 1000 : 0);
  }

  // A repeated prompt hits the radix cache except for its last token, which SGLang always recomputes.
  #cachedTokens({ digest, promptTokens }: ChatRequest): number {
    if (this.#seenDigests.has(digest)) return Math.max(0, promptTokens - 1);
    if (this.#seenDigests.size >= SEEN_DIGESTS_LIMIT) this.#seenDigests.clear();
    this.#seenDigests.add(digest);
    return 0;
  }
}

/** Starts an SGLang look-alike on `host:port` (127.0.0.1 and a free port by default). */
export async function startSimulator(opts: SimOptions = {}): Promise<Simulator> {
  const { onDie, ...options } = opts;
  const knobs: Knobs = { ...DEFAULTS, ...checkKnobs(options, 'start') };
  const sim = new SimServer(knobs, onDie);
  await new Promise<void>((resolve, reject) => {
    sim.http.once('error', reject);
    sim.http.listen(knobs.port, knobs.host, () => {
      sim.http.off('error', reject);
      resolve();
    });
  });
  const { port } = sim.http.address() as AddressInfo;
  const host = knobs.host.includes(':') ? `[${knobs.host}]` : knobs.host;
  return {
    url: `http://${host}:${port}`,
    port,
    stats: () => sim.stats(),
    configure: (patch) => {
      sim.configure(patch);
    },
    // Destroying every socket (idle keep-alive and hung requests included) is what lets tests end promptly.
    close: () =>
      new Promise<void>((resolve) => {
        sim.http.close(() => resolve());
        sim.http.closeAllConnections();
      }),
  };
}
