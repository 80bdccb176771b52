import type { Agent } from 'node:http';
import OpenAI from 'openai';
import type { EndpointRow } from '../db/schema.js';
import { servesModel } from '../domain/models.js';
import type { EndpointState } from '../domain/statuses.js';
import { capInUse, type CapSource, type ServerCapacity } from '../domain/concurrency.js';
import type { EndpointLive } from '../domain/live-view.js';
import { lent } from '../domain/schedule.js';
import { type AdaptiveCap, type Load, YieldCap } from './capacity.js';
import { agentFetch, endpointAgent, streamPost, type StreamRequest, type WholeAnswer } from './http-fetch.js';
import { LatencyRing, RateWindow } from './rates.js';
import type { IdMode } from './token-ids.js';

const MINUTE_MS = 60_000;
/** The gateway's header that puts a request in the class it sheds first (docs/sglang.md "Priority"). */
const BULK_HEADER = { 'x-smg-priority': 'bulk' } as const;

/** One SGLang server as the runner sees it: its row, its client, its live load, and what is in flight on it. */
export class LiveEndpoint {
  client: OpenAI;
  private agent: Agent;
  readonly inFlight = new Map<number, AbortController>();
  /** Transport failures in a row while dispatching. */
  consecutiveFailures = 0;
  nextProbeAt = 0;
  /** Probes failed in a row: enough of them judge a ready endpoint unhealthy (endpoint-probes.ts). */
  probeFailures = 0;
  probing = false;
  /**
   * Nothing new is sent until a probe succeeds: the endpoint was just loaded (regen started, or it
   * joined), a probe failed, the server answered /health with 503 (it drains), or a connection
   * broke (it may have restarted, with another model). What runs there goes on to its own answer,
   * error or timeout.
   */
  suspect = true;
  /** No probe has come back since the endpoint was loaded or came to be driven here. */
  unprobed = true;
  nextLoadAt = 0;
  loading = false;
  /** Which load route the server has: /v1/loads (v0.5.8+), else /metrics (with --enable-metrics), else none. */
  loadRoute: 'loads' | 'metrics' | 'none' = 'loads';
  hasMetrics = true;
  /** How the server returns token ids, once a run that writes them has probed it (id-probe.ts); null until then, and again after a restart. */
  idMode: IdMode | null = null;
  /** That probe while it runs. */
  idProbe: Promise<void> | null = null;
  /** Answers that refused the id parameters the probe found since the server started (id-probe.ts idRefused). */
  idRefusals = 0;
  load: Load | null = null;
  adaptive: AdaptiveCap | null = null;
  readonly rate = new RateWindow();
  readonly latency = new LatencyRing();
  /** Turned away by the server (429, a gateway's shedding): nothing new is sent before this, and the cap is held lower for a while. */
  busyUntil = 0;
  readonly yieldCap = new YieldCap();
  /** When it went off schedule, for drain_grace_ms; null while lent. */
  offSince: number | null = null;
  /** The schedule's verdict for one minute of the clock (windows are to the minute): dispatch asks it for every slot. */
  private scheduledAt: { minute: number; row: EndpointRow; open: boolean } | null = null;

  constructor(
    public row: EndpointRow,
    private readonly clock: () => number = Date.now,
  ) {
    this.agent = endpointAgent(row.url);
    this.client = this.makeClient();
  }

  /** Outside its schedule or past lend_until: regen sends nothing new here. */
  get offSchedule(): boolean {
    const now = this.clock();
    if (this.row.lendUntil !== null && now >= this.row.lendUntil) return true;
    if (!this.row.schedule) return false;
    const minute = Math.floor(now / MINUTE_MS);
    if (this.scheduledAt?.minute !== minute || this.scheduledAt.row !== this.row) {
      this.scheduledAt = { minute, row: this.row, open: lent({ ...this.row, lendUntil: null }, minute * MINUTE_MS) };
    }
    return !this.scheduledAt.open;
  }

  /** Turned away by the server and still backing off. */
  get busy(): boolean {
    return this.clock() < this.busyUntil;
  }

  /** The server took the `priority` field (or none is set): it is sent with every request. */
  get sendsPriority(): boolean {
    return this.row.requestPriority !== null && this.row.priorityRefusedAt === null;
  }

  /** The headers every request here carries besides its key: the gateway's bulk class when asked for. */
  get extraHeaders(): Record<string, string> {
    return this.row.bulkHeader ? BULK_HEADER : {};
  }

  private makeClient(): OpenAI {
    // Retries are regen's job (on any endpoint, with backoff), not the client's.
    return new OpenAI({ baseURL: `${this.row.url}/v1`, apiKey: this.row.apiKey ?? 'none', maxRetries: 0, fetch: agentFetch(this.agent) });
  }

  /** A streamed chat completion on this endpoint's connections (see streamPost). */
  streamChat(body: Record<string, unknown>, r: Omit<StreamRequest, 'url' | 'headers' | 'body'>): Promise<WholeAnswer | undefined> {
    const headers: Record<string, string> = { ...this.extraHeaders, ...(this.row.apiKey && { authorization: `Bearer ${this.row.apiKey}` }) };
    return streamPost(this.agent, { ...r, url: `${this.row.url}/v1/chat/completions`, headers, body: JSON.stringify(body) });
  }

  /** Takes a changed row; a new url or key gets a new client (and, for a new url, new connections). */
  update(row: EndpointRow): void {
    const old = this.row;
    this.row = row;
    if (old.url !== row.url) {
      this.agent.destroy();
      this.agent = endpointAgent(row.url);
    }
    if (old.url !== row.url || old.apiKey !== row.apiKey) this.client = this.makeClient();
  }

  /** Closes the idle keep-alive connections of an endpoint that left the pool. */
  close(): void {
    this.agent.destroy();
  }

  get capacity(): ServerCapacity {
    return { maxRunning: this.row.serverMaxRunning, kvTokens: this.row.kvTokens };
  }

  /** On a shared endpoint, the cap its last load reading left regen (capacity.ts sharedCap); null when not shared or not read yet. */
  sharedCap: number | null = null;

  /** The cap in use and where it comes from: never above what sharing leaves, nor what a server turning regen away lets it have. */
  capInfo(fallback: number): { cap: number; source: CapSource } {
    const inUse = capInUse(this.row.maxConcurrency, this.capacity, this.adaptive?.cap ?? null, fallback);
    const shared = this.row.share && this.sharedCap !== null ? Math.min(inUse.cap, this.sharedCap) : inUse.cap;
    return { cap: this.yieldCap.limit(shared), source: inUse.source };
  }

  get state(): EndpointState {
    return this.row.state as EndpointState;
  }

  /**
   * Judged worse than its peers, while its quarantine commits: nothing new is sent, and its
   * answers from then on are asked again elsewhere, as once it is quarantined.
   */
  quarantining = false;

  /**
   * This process drives the endpoint (the fleet's share: fleet/): only then does it probe it and
   * send to it. Always true for a process that dispatches alone.
   */
  driven = true;
  /** Being handed to another replica: nothing new is sent, and once what runs there ends it goes. */
  handingOff = false;

  /** Ready, driven here, and not waiting for a probe to clear it: it takes samples whenever it is lent and not turned away. */
  get serving(): boolean {
    return this.state === 'ready' && this.driven && !this.handingOff && !this.suspect && !this.quarantining;
  }

  /** Serving, lent now and not turned away: new samples may be sent. */
  get dispatchable(): boolean {
    return this.serving && !this.busy && !this.offSchedule;
  }

  /**
   * Worth waiting for as a sample's home (endpoint-choice.ts pickForSlot): dispatchable, or ready
   * as stored and only waiting for its first probe (regen just started). Without the second, the
   * endpoint whose probe comes back first after a restart would take every turn held for the others.
   */
  get holdsAffinity(): boolean {
    return this.dispatchable || (this.unprobed && this.state === 'ready' && this.driven && !this.handingOff && !this.quarantining);
  }

  serves(model: string): boolean {
    return servesModel(this.row.model, this.row.aliases, model);
  }

  live(now: number): EndpointLive {
    const r = this.rate.rates(now);
    return {
      in_flight: this.inFlight.size,
      samples_per_second: Math.round(r.samples * 100) / 100,
      completion_tokens_per_second: Math.round(r.tokens * 100) / 100,
      p50_latency_ms: this.latency.p50(),
      adaptive_cap: this.adaptive?.cap ?? null,
      server: {
        running: this.load?.running ?? null,
        queued: this.load?.waiting ?? null,
        token_usage: this.load?.tokenUsage == null ? null : Math.round(this.load.tokenUsage * 1000) / 1000,
        cache_hit_rate: this.load?.cacheHitRate == null ? null : Math.round(this.load.cacheHitRate * 10_000) / 10_000,
        read_at: this.load?.at ?? null,
      },
    };
  }
}
