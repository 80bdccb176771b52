import type { Agent } from 'node:http';
import OpenAI from 'openai';
import type { Db } from '../db/client.js';
import { getEndpoint, listEndpoints, updateEndpointIfState } from '../db/endpoints.js';
import type { EndpointRow } from '../db/schema.js';
import { servesModel } from '../domain/models.js';
import type { EndpointState } from '../domain/statuses.js';
import type { Logger } from '../logger.js';
import { capInUse, type CapSource, type ServerCapacity } from '../domain/concurrency.js';
import type { AdaptiveCap, Load } from './capacity.js';
import { agentFetch, endpointAgent, streamPost, type StreamRequest, type WholeAnswer } from './http-fetch.js';
import { Coalesced } from './coalesced.js';
import { LatencyRing, RateWindow } from './rates.js';
import { IDLE_ENDPOINT, type EndpointLive } from '../domain/live-view.js';

/** Consecutive transport failures while dispatching after which an endpoint is taken out of rotation. */
export const UNHEALTHY_AFTER = 3;

/** The first look at an endpoint that just joined or went down comes soon: a second, or the interval when shorter. */
export function firstProbeDelayMs(probeIntervalMs: number): number {
  return Math.min(1000, probeIntervalMs);
}

export interface PoolSettings {
  probeIntervalMs: number;
  healthTimeoutMs: number;
  unhealthyAfterProbes: number;
  loadIntervalMs: number;
  adaptiveConcurrency: boolean;
  defaultConcurrency: number;
}

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
  load: Load | null = null;
  adaptive: AdaptiveCap | null = null;
  readonly rate = new RateWindow();
  readonly latency = new LatencyRing();

  constructor(public row: EndpointRow) {
    this.agent = endpointAgent(row.url);
    this.client = this.makeClient();
  }

  private makeClient(): OpenAI {
    // Retries are regen's job (on any endpoint, with backoff), not the client's.
    return new OpenAI({ baseURL: `${this.row.url}/v1`, apiKey: this.row.apiKey ?? 'none', maxRetries: 0, fetch: agentFetch(this.agent) });
  }

  /** A streamed chat completion on this endpoint's connections (see streamPost). */
  streamChat(body: Record<string, unknown>, r: Omit<StreamRequest, 'url' | 'headers' | 'body'>): Promise<WholeAnswer | undefined> {
    const headers: Record<string, string> = this.row.apiKey ? { authorization: `Bearer ${this.row.apiKey}` } : {};
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

  /** The cap in use and where it comes from. */
  capInfo(fallback: number): { cap: number; source: CapSource } {
    return capInUse(this.row.maxConcurrency, this.capacity, this.adaptive?.cap ?? null, fallback);
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

  /** Ready, driven here, and not waiting for a probe to clear it: new samples may be sent. */
  get dispatchable(): boolean {
    return this.state === 'ready' && this.driven && !this.handingOff && !this.suspect && !this.quarantining;
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

/**
 * The endpoints as this process sees them, kept in step with the table: their rows, clients,
 * slots and caps, which of them this process drives, and the state changes it writes. Their
 * probes are endpoint-probes.ts.
 */
export class EndpointPool {
  readonly live = new Map<string, LiveEndpoint>();
  /** The endpoints this process drives, as the fleet last said (fleet/); null while it drives them all. */
  private drivenIds: Set<string> | null = null;

  constructor(
    private readonly db: Db,
    private readonly logger: Logger,
    private readonly clock: () => number,
    private readonly settings: PoolSettings,
    private readonly onChange: () => void,
    private readonly onRemoved: (e: LiveEndpoint) => void,
  ) {}

  /**
   * The endpoints this process drives from now on (a replica's share: fleet/replica.ts). One newly
   * driven is probed before anything is sent to it; one no longer driven gets nothing new (the
   * fleet handed it over once its requests ended).
   */
  drive(ids: ReadonlySet<string>): void {
    this.drivenIds = new Set(ids);
    for (const e of this.live.values()) this.markDriven(e);
  }

  private markDriven(e: LiveEndpoint): void {
    const driven = this.drivenIds?.has(e.row.id) ?? true;
    if (driven && !e.driven) {
      e.suspect = true;
      e.unprobed = true;
      e.nextProbeAt = 0;
      e.probeFailures = 0;
      this.onChange();
    }
    if (!driven) e.handingOff = false;
    e.driven = driven;
  }

  private readonly syncs = new Coalesced();

  /**
   * Re-reads the endpoints table: new rows join, removed rows leave, edited rows are refreshed.
   * Reads never overlap: one asked for while another runs starts when it ends, and reads anew.
   */
  sync(): Promise<void> {
    return this.syncs.run(() => this.readTable());
  }

  private async readTable(): Promise<void> {
    const rows = await listEndpoints(this.db);
    const seen = new Set<string>();
    for (const row of rows) {
      seen.add(row.id);
      const e = this.live.get(row.id);
      if (!e) {
        const joined = new LiveEndpoint(row);
        joined.driven = this.drivenIds?.has(row.id) ?? true;
        this.live.set(row.id, joined);
        continue;
      }
      this.takeRow(e, row);
    }
    for (const [id, e] of this.live) {
      if (!seen.has(id)) {
        this.live.delete(id);
        this.onRemoved(e);
        e.close();
      }
    }
  }

  /** A row read from the table; a state someone else set (an operator, a re-registration) is probed afresh. */
  private takeRow(e: LiveEndpoint, row: EndpointRow): void {
    // A read that began before this pool's own last write (a quarantine, a probe's verdict) would
    // put back what that write replaced.
    if (row.updatedAt < e.row.updatedAt) return;
    const wasState = e.row.state;
    e.update(row);
    if (row.state === wasState) return;
    e.nextProbeAt = 0;
    e.probeFailures = 0;
  }

  /** Takes an endpoint's row as the database has it, whatever this pool wrote since (a write that was rolled back). */
  async reload(e: LiveEndpoint): Promise<void> {
    const row = await getEndpoint(this.db, e.row.id);
    if (!row) return;
    const wasState = e.row.state;
    e.update(row);
    if (row.state !== wasState) {
      e.nextProbeAt = 0;
      this.onChange();
    }
  }

  /** Closes every endpoint's idle connections: the runner stops. */
  close(): void {
    for (const e of this.live.values()) e.close();
  }

  capOf(e: LiveEndpoint): number {
    return e.capInfo(this.settings.defaultConcurrency).cap;
  }

  /** Models some dispatchable endpoint serves now, as a test for a run's model. */
  servesNow(model: string): boolean {
    for (const e of this.live.values()) if (e.dispatchable && e.serves(model)) return true;
    return false;
  }

  /** Whether any endpoint serves `model` now: here, or ready by its row when another replica drives it. */
  servedAnywhere(model: string): boolean {
    for (const e of this.live.values()) if (e.serves(model) && (e.dispatchable || (!e.driven && e.state === 'ready'))) return true;
    return false;
  }

  /**
   * The ids of the endpoints this process drives when it drives only some (a replica of several),
   * else null. One being handed over is left out: the conversations whose prefix it holds wait
   * for its next driver rather than move here.
   */
  drivesOnly(): string[] | null {
    return this.drivenIds ? [...this.drivenIds].filter((id) => this.live.get(id)?.handingOff !== true) : null;
  }

  /** The endpoints this process drives. */
  driven(): LiveEndpoint[] {
    return [...this.live.values()].filter((e) => e.driven);
  }

  /** The free and total slots of the dispatchable endpoints serving `model`. */
  slotsFor(model: string): { free: number; total: number } {
    let free = 0;
    let total = 0;
    for (const e of this.live.values()) {
      if (!e.dispatchable || !e.serves(model)) continue;
      const cap = this.capOf(e);
      total += cap;
      free += Math.max(0, cap - e.inFlight.size);
    }
    return { free, total };
  }

  /** What the endpoints serve, for a run that none can serve: "ep_x (/models/Qwen3-27B, ready)". */
  describeServed(): string {
    if (this.live.size === 0) return 'no endpoints are registered';
    const parts = [...this.live.values()].map((e) => {
      const names = [e.row.model ?? 'model not known yet', ...e.row.aliases].join(', ');
      return `${e.row.name} (${names}; ${e.suspect && e.state === 'ready' ? 'being probed' : e.state})`;
    });
    return `the endpoints serve: ${parts.join('; ')}`;
  }

  liveOf(endpointId: string, now: number): EndpointLive {
    const e = this.live.get(endpointId);
    return e ? e.live(now) : IDLE_ENDPOINT;
  }

  /** The live view of the endpoints this process drives. */
  snapshot(now: number): Record<string, EndpointLive> {
    const out: Record<string, EndpointLive> = {};
    for (const e of this.live.values()) if (e.driven) out[e.row.id] = e.live(now);
    return out;
  }

  /**
   * Moves an endpoint to `state`, only while it is still in the state `expected` (by default the one
   * this pool last saw): an operator's change made meanwhile wins, and the row is read again.
   */
  async setState(
    e: LiveEndpoint,
    state: EndpointState,
    lastError: string | null,
    extra: Partial<EndpointRow> = {},
    expected = e.row.state,
    db: Db = this.db,
  ): Promise<boolean> {
    const now = this.clock();
    const set = { state, lastError, lastCheckedAt: now, updatedAt: now, ...extra };
    if (!(await updateEndpointIfState(db, e.row.id, expected, set))) {
      const row = await getEndpoint(db, e.row.id);
      if (row) this.takeRow(e, row);
      return false;
    }
    const changed = e.row.state !== state;
    e.row = { ...e.row, ...set };
    if (changed) {
      this.logger.info({ endpoint_id: e.row.id, url: e.row.url, state, reason: lastError ?? undefined }, 'endpoint state');
      this.onChange();
    }
    return true;
  }

  /**
   * A transport failure seen while dispatching: nothing more is sent until a probe (at once) says
   * the server is back, and enough in a row take the endpoint out. True when it was taken out, so
   * that what runs there is given back: its connections are failing.
   */
  async transportFailure(e: LiveEndpoint, message: string): Promise<boolean> {
    e.consecutiveFailures++;
    e.suspect = true;
    e.nextProbeAt = Math.min(e.nextProbeAt, this.clock());
    if (e.state === 'ready' && e.consecutiveFailures >= UNHEALTHY_AFTER) {
      e.probeFailures = 0;
      e.nextProbeAt = this.clock() + firstProbeDelayMs(this.settings.probeIntervalMs);
      return this.setState(e, 'unhealthy', message);
    }
    return false;
  }
}
