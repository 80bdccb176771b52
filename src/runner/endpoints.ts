import type { Agent } from 'node:http';
import OpenAI from 'openai';
import type { Db } from '../db/client.js';
import { getEndpoint, listEndpoints, updateEndpointIfState } from '../db/endpoints.js';
import type { EndpointRow } from '../db/schema.js';
import { servesModel } from '../domain/models.js';
import { PARKED_ENDPOINT_STATES, type EndpointState } from '../domain/statuses.js';
import type { Logger } from '../logger.js';
import { capInUse, type CapSource, type ServerCapacity } from '../domain/concurrency.js';
import { AdaptiveCap, serverCeiling, type Load } from './capacity.js';
import { backoffMs, firstProbeDelayMs, probeBackoff } from './failure-policy.js';
import { agentFetch, endpointAgent, streamPost, type StreamRequest, type WholeAnswer } from './http-fetch.js';
import { Coalesced } from './coalesced.js';
import { LatencyRing, RateWindow } from './rates.js';
import { parseLoads, parseMetrics, parseModels, parseServerInfo } from './server-info.js';
import { IDLE_ENDPOINT, type EndpointLive } from './view.js';

/** Consecutive transport failures while dispatching after which an endpoint is taken out of rotation. */
export const UNHEALTHY_AFTER = 3;
/** Every probe request but /health: these answer at once on a healthy server. */
const PROBE_TIMEOUT_MS = 5000;
/** A probe reads at most this much of an answer: a server must not fill regen's memory. */
const PROBE_MAX_BYTES = 4 << 20;
/** The adaptive cap's ceiling on a server that does not say what it can run. */
const UNKNOWN_CEILING = 100_000;
const MAX_REASON_CHARS = 300;

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
  /** Probes failed in a row; the wait before the next one grows with it. */
  probeFailures = 0;
  probing = false;
  /**
   * Nothing new is sent until a probe succeeds: the endpoint was just loaded (regen started, or it
   * joined), a probe failed, the server answered /health with 503 (it drains), or a connection
   * broke (it may have restarted, with another model). What runs there goes on to its own answer,
   * error or timeout.
   */
  suspect = true;
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
   * PostgreSQL: this replica drives the endpoint (src/db/replicas.ts): only then does it probe it
   * and send to it. Always true on SQLite, where one process drives them all.
   */
  driven = true;
  /** PostgreSQL: being handed to another replica: nothing new is sent, and once what runs there ends it goes. */
  handingOff = false;

  /** Ready, driven here, and not waiting for a probe to clear it: new samples may be sent. */
  get dispatchable(): boolean {
    return this.state === 'ready' && this.driven && !this.handingOff && !this.suspect && !this.quarantining;
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
        read_at: this.load?.at ?? null,
      },
    };
  }
}

/** Reads at most `limit` bytes of a body: a probe must not let a server fill regen's memory. */
async function readCapped(res: Response, limit: number): Promise<string> {
  if (!res.body) return '';
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    size += chunk.length;
    if (size > limit) {
      await res.body.cancel().catch(() => {});
      throw new Error(`probe answer is larger than ${limit} bytes`);
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}

async function getJson(url: string, apiKey: string | null, timeoutMs = PROBE_TIMEOUT_MS): Promise<{ status: number; body: unknown }> {
  const res = await fetch(url, {
    headers: apiKey ? { authorization: `Bearer ${apiKey}` } : {},
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await readCapped(res, PROBE_MAX_BYTES);
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    /* /health and /metrics answer with text */
  }
  return { status: res.status, body };
}

/** `/server_info`, or the deprecated `/get_server_info` on a server older than v0.5.6. */
async function serverInfo(url: string, apiKey: string | null) {
  let info = await getJson(`${url}/server_info`, apiKey);
  if (info.status === 404) info = await getJson(`${url}/get_server_info`, apiKey);
  return info.status === 200 ? parseServerInfo(info.body) : null;
}

type HealthVerdict = { ok: true } | { ok: false; reason: string; loading: boolean };

/**
 * Keeps the in-memory endpoint set in step with the table and probes each server as SGLANG.md
 * describes it. `/health` is a real one-token generation that can take many seconds on a busy
 * server: a slow or failed probe stops new dispatch there until a probe succeeds, and only
 * `unhealthyAfterProbes` failures in a row make a ready endpoint unhealthy. Neither aborts the
 * requests running there. Each successful probe reads the served model and the capacity again, so a
 * restart or a new model is noticed before anything more is sent; the live load is read every
 * `loadIntervalMs` to steer the cap.
 */
export class EndpointPool {
  readonly live = new Map<string, LiveEndpoint>();
  /** PostgreSQL: the endpoints this replica drives, as its last balance left them; null on SQLite (all of them). */
  private drivenIds: Set<string> | null;

  constructor(
    private readonly db: Db,
    private readonly logger: Logger,
    private readonly clock: () => number,
    private readonly settings: PoolSettings,
    private readonly onChange: () => void,
    private readonly onRemoved: (e: LiveEndpoint) => void,
  ) {
    this.drivenIds = db.dialect === 'pg' ? new Set() : null;
  }

  /**
   * PostgreSQL: the endpoints this replica drives from now on. One newly driven is probed before
   * anything is sent to it; one no longer driven gets nothing new (the caller handed it over once
   * its requests ended).
   */
  drive(ids: ReadonlySet<string>): void {
    this.drivenIds = new Set(ids);
    for (const e of this.live.values()) this.markDriven(e);
  }

  private markDriven(e: LiveEndpoint): void {
    const driven = this.drivenIds?.has(e.row.id) ?? true;
    if (driven && !e.driven) {
      e.suspect = true;
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

  /** PostgreSQL: the endpoints this replica drives. */
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

  /** The live view of the endpoints this process drives (all of them on SQLite). */
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

  probeDue(): void {
    const now = this.clock();
    for (const e of this.live.values()) {
      // Another replica drives it: that one probes it.
      if (!e.driven) continue;
      if (!e.probing && e.nextProbeAt <= now && !this.parked(e)) {
        e.probing = true;
        this.probe(e)
          .catch((err) => this.logger.warn({ endpoint_id: e.row.id, err: { message: (err as Error).message } }, 'probe failed'))
          .finally(() => (e.probing = false));
      }
      if (!e.loading && e.nextLoadAt <= now && e.state === 'ready' && e.loadRoute !== 'none') {
        e.loading = true;
        this.readLoad(e)
          .catch(() => {})
          .finally(() => (e.loading = false));
      }
    }
  }

  /** Removed, or parked by an operator or the quality gate: probes leave it alone, and must not revive it. */
  private parked(e: LiveEndpoint): boolean {
    return !this.live.has(e.row.id) || PARKED_ENDPOINT_STATES.includes(e.state);
  }

  private async health(e: LiveEndpoint): Promise<HealthVerdict> {
    const timeoutMs = this.settings.healthTimeoutMs;
    try {
      const res = await getJson(`${e.row.url}/health`, e.row.apiKey, timeoutMs);
      if (res.status === 200) return { ok: true };
      if (res.status === 503) {
        // Before the first 200 the server is warming up; after it, it is shutting down cleanly.
        return e.state === 'ready'
          ? { ok: false, reason: '/health answered 503: the server is draining; nothing new is sent, running requests finish', loading: false }
          : { ok: false, reason: '/health answered 503 (the server is still loading)', loading: true };
      }
      return { ok: false, reason: `/health answered ${res.status}`, loading: false };
    } catch (err) {
      const code = (err as { cause?: { code?: string } }).cause?.code;
      if (code === 'ECONNREFUSED') return { ok: false, reason: 'connection refused', loading: true };
      if (code === 'ECONNRESET') return { ok: false, reason: 'connection reset', loading: false };
      const timedOut = (err as Error).name === 'TimeoutError';
      return {
        ok: false,
        reason: timedOut ? `health probe timed out after ${Math.round(timeoutMs / 1000)} s` : 'health probe failed',
        loading: false,
      };
    }
  }

  private async probe(e: LiveEndpoint): Promise<void> {
    const before = e.row.state;
    const verdict = await this.health(e);
    if (this.parked(e)) return;
    if (!verdict.ok) return this.probeFailed(e, before, verdict.reason, verdict.loading);
    const { url, apiKey } = e.row;
    let models: ReturnType<typeof parseModels>;
    let info: Awaited<ReturnType<typeof serverInfo>> = null;
    try {
      const res = await getJson(`${url}/v1/models`, apiKey);
      models = res.status === 200 ? parseModels(res.body) : null;
      if (!models) throw new Error(`/v1/models answered ${res.status} without a model`);
      // Optional: not every OpenAI-compatible server has it.
      info = await serverInfo(url, apiKey).catch(() => null);
    } catch (err) {
      // A server that died between its /health and these reads: said as such, not as fetch's "fetch failed".
      const code = (err as { cause?: { code?: string } }).cause?.code;
      const reason = code === 'ECONNREFUSED' ? 'connection refused' : code === 'ECONNRESET' ? 'connection reset' : (err as Error).message;
      return this.probeFailed(e, before, reason.slice(0, MAX_REASON_CHARS), false);
    }
    if (this.parked(e)) return;
    this.noticeChanges(e, models.model, info?.startupTime ?? null);
    const extra: Partial<EndpointRow> = {
      model: models.model,
      maxModelLen: models.maxModelLen,
      serverMaxRunning: info?.capacity.maxRunning ?? e.row.serverMaxRunning,
      kvTokens: info?.capacity.kvTokens ?? e.row.kvTokens,
      startupTime: info?.startupTime ?? e.row.startupTime,
    };
    const now = this.clock();
    e.nextProbeAt = now + this.settings.probeIntervalMs;
    e.probeFailures = 0;
    if (!(await this.setState(e, 'ready', null, extra, before))) return;
    e.consecutiveFailures = 0;
    if (e.suspect) {
      e.suspect = false;
      this.onChange();
    }
    this.fitCeiling(e);
    // The adaptive cap starts low, before the first load reading, rather than at a running limit
    // that SGLang sets far past what its KV pool holds.
    if (this.settings.adaptiveConcurrency && e.loadRoute !== 'none') e.adaptive ??= new AdaptiveCap(this.ceiling(e));
    if (e.capInfo(this.settings.defaultConcurrency).source === 'default') this.warnDefault(e);
  }

  private async probeFailed(e: LiveEndpoint, before: string, reason: string, loading: boolean): Promise<void> {
    const now = this.clock();
    const failures = ++e.probeFailures;
    const wait = backoffMs(failures, probeBackoff(this.settings.probeIntervalMs));
    if (e.state === 'ready') {
      e.suspect = true;
      // Soon again: one slow probe of a busy server should hold its dispatch back briefly, not for long.
      e.nextProbeAt = now + firstProbeDelayMs(this.settings.probeIntervalMs);
      const judged = failures >= this.settings.unhealthyAfterProbes;
      await this.setState(e, judged ? 'unhealthy' : 'ready', `${reason} (${failures} of ${this.settings.unhealthyAfterProbes} probes in a row)`, {}, before);
      return;
    }
    // A server still loading is looked at every interval: it may come up any moment.
    e.nextProbeAt = now + (e.state === 'starting' ? Math.min(wait, this.settings.probeIntervalMs) : wait);
    // A server never seen healthy is still starting; one that was up and stopped answering is unhealthy.
    const next: EndpointState = e.state === 'starting' && (loading || e.row.model === null) ? 'starting' : 'unhealthy';
    await this.setState(e, next, reason, {}, before);
  }

  /** A new served model or a new process: logged, and the endpoint leaves runs for the old model. */
  private noticeChanges(e: LiveEndpoint, model: string, startupTime: number | null): void {
    const old = e.row;
    if (old.model !== null && old.model !== model) {
      this.logger.warn({ endpoint_id: old.id, url: old.url, from: old.model, model }, 'the endpoint now serves another model');
    } else if (old.startupTime !== null && startupTime !== null && old.startupTime !== startupTime) {
      this.logger.info({ endpoint_id: old.id, url: old.url, model }, 'the endpoint restarted');
    }
    if (old.startupTime !== startupTime && startupTime !== null) {
      // Another process: its load and what regen learnt of it start over.
      e.adaptive = null;
      e.load = null;
      e.loadRoute = 'loads';
      e.hasMetrics = true;
    }
  }

  private ceiling(e: LiveEndpoint): number {
    const server = e.row.serverMaxRunning === null ? UNKNOWN_CEILING : serverCeiling(e.row.serverMaxRunning);
    return Math.min(server, e.row.maxConcurrency ?? Number.POSITIVE_INFINITY);
  }

  private fitCeiling(e: LiveEndpoint): void {
    e.adaptive?.setCeiling(this.ceiling(e));
  }

  private readonly warned = new Set<string>();

  private warnDefault(e: LiveEndpoint): void {
    if (this.warned.has(e.row.id)) return;
    this.warned.add(e.row.id);
    this.logger.warn(
      { endpoint_id: e.row.id, url: e.row.url, cap: this.settings.defaultConcurrency },
      'the server says neither what it can run nor its load: its cap is REGEN_DEFAULT_CONCURRENCY; set max_concurrency on the endpoint',
    );
  }

  /** The server's live load: /v1/loads for running, waiting and KV usage, /metrics for retractions. */
  private async readLoad(e: LiveEndpoint): Promise<void> {
    const { url, apiKey } = e.row;
    e.nextLoadAt = this.clock() + this.settings.loadIntervalMs;
    let load: Load | null = null;
    if (e.loadRoute === 'loads') {
      const res = await getJson(`${url}/v1/loads?include=core`, apiKey).catch(() => null);
      if (res?.status === 404) e.loadRoute = 'metrics';
      else if (res?.status === 200) load = parseLoads(res.body, this.clock());
    }
    if (e.hasMetrics) {
      const res = await getJson(`${url}/metrics`, apiKey).catch(() => null);
      if (res?.status === 404) {
        e.hasMetrics = false;
        if (e.loadRoute === 'metrics') {
          // Nothing tells this server's load: its cap is its own running limit, or the default.
          e.loadRoute = 'none';
          e.adaptive = null;
          this.onChange();
        }
      } else if (res?.status === 200 && typeof res.body === 'string') {
        const m = parseMetrics(res.body, this.clock());
        if (m && load) load = { ...load, retracted: m.retracted, retractedNow: m.retractedNow };
        else if (m && e.loadRoute === 'metrics') load = m;
      }
    }
    if (!load) return;
    e.load = load;
    if (!this.settings.adaptiveConcurrency) return;
    const before = e.adaptive?.cap ?? null;
    e.adaptive ??= new AdaptiveCap(this.ceiling(e));
    e.adaptive.observe(load, e.inFlight.size);
    if (e.adaptive.cap !== before) this.onChange();
  }
}
