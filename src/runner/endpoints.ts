import type { Agent } from 'node:http';
import OpenAI from 'openai';
import type { Db } from '../db/client.js';
import { effectiveConcurrency, listEndpoints, updateEndpoint } from '../db/endpoints.js';
import type { EndpointState } from '../domain/statuses.js';
import type { EndpointRow } from '../db/schema.js';
import type { Logger } from '../logger.js';
import { agentFetch, endpointAgent } from './http-fetch.js';
import { LatencyRing, RateWindow } from './rates.js';
import { backoffMs, firstProbeDelayMs, probeBackoff } from './failure-policy.js';
import { IDLE_ENDPOINT, type EndpointLive } from './view.js';

/** Consecutive transport failures after which an endpoint is taken out of rotation. */
export const UNHEALTHY_AFTER = 3;
const PROBE_TIMEOUT_MS = 5000;
/** A probe reads at most this much of an answer: a server must not fill regen's memory. */
const PROBE_MAX_BYTES = 4 << 20;

/** One SGLang server as the runner sees it: its row, its client, and what is in flight on it. */
export class LiveEndpoint {
  client: OpenAI;
  private agent: Agent;
  readonly inFlight = new Map<number, AbortController>();
  consecutiveFailures = 0;
  nextProbeAt = 0;
  /** Probes failed in a row; the wait before the next one grows with it. */
  probeFailures = 0;
  probing = false;
  server: { running: number | null; queued: number | null } = { running: null, queued: null };
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

  cap(fallback: number): number {
    return effectiveConcurrency(this.row, fallback);
  }

  get state(): EndpointState {
    return this.row.state as EndpointState;
  }

  live(now: number): EndpointLive {
    const r = this.rate.rates(now);
    return {
      in_flight: this.inFlight.size,
      samples_per_second: Math.round(r.samples * 100) / 100,
      completion_tokens_per_second: Math.round(r.tokens * 100) / 100,
      p50_latency_ms: this.latency.p50(),
      server: this.server,
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

async function getJson(url: string, apiKey: string | null): Promise<{ status: number; body: unknown }> {
  const res = await fetch(url, {
    headers: apiKey ? { authorization: `Bearer ${apiKey}` } : {},
    signal: AbortSignal.timeout(PROBE_TIMEOUT_MS),
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

function metricValue(text: string, name: string): number | null {
  const m = new RegExp(`^${name.replace(/[:]/g, '\\:')}(?:\\{[^}]*\\})?\\s+([0-9.eE+-]+)`, 'm').exec(text);
  return m ? Number(m[1]) : null;
}

/**
 * Keeps the in-memory endpoint set in step with the table and probes each server: `starting`
 * until /health answers 200 (SGLang loads weights for minutes), then the served model and
 * max_running_requests are read; `unhealthy` ones are probed again with backoff.
 */
export class EndpointPool {
  readonly live = new Map<string, LiveEndpoint>();

  constructor(
    private readonly db: Db,
    private readonly logger: Logger,
    private readonly clock: () => number,
    private readonly probeIntervalMs: number,
    private readonly onChange: () => void,
    private readonly onRemoved: (e: LiveEndpoint) => void,
  ) {}

  /** Re-reads the endpoints table: new rows join, removed rows leave, edited rows are refreshed. */
  sync(): void {
    const rows = listEndpoints(this.db);
    const seen = new Set<string>();
    for (const row of rows) {
      seen.add(row.id);
      const e = this.live.get(row.id);
      if (!e) this.live.set(row.id, new LiveEndpoint(row));
      else {
        const wasState = e.row.state;
        e.update(row);
        if (row.state === 'starting' && wasState !== 'starting') {
          e.nextProbeAt = 0;
          e.probeFailures = 0;
        }
      }
    }
    for (const [id, e] of this.live) {
      if (!seen.has(id)) {
        this.live.delete(id);
        this.onRemoved(e);
        e.close();
      }
    }
  }

  /** Closes every endpoint's idle connections: the runner stops. */
  close(): void {
    for (const e of this.live.values()) e.close();
  }

  /** Models some ready endpoint serves now. */
  servedModels(): Set<string> {
    const served = new Set<string>();
    for (const e of this.live.values()) if (e.state === 'ready' && e.row.model) served.add(e.row.model);
    return served;
  }

  /** Endpoints judged unhealthy that still have requests in flight. */
  unhealthyWithFlights(): LiveEndpoint[] {
    return [...this.live.values()].filter((e) => e.state === 'unhealthy' && e.inFlight.size > 0);
  }

  /** The free and total slots of the ready endpoints serving `model`. */
  slotsFor(model: string, fallback: number): { free: number; total: number } {
    let free = 0;
    let total = 0;
    for (const e of this.live.values()) {
      if (e.state !== 'ready' || e.row.model !== model) continue;
      const cap = e.cap(fallback);
      total += cap;
      free += Math.max(0, cap - e.inFlight.size);
    }
    return { free, total };
  }

  liveOf(endpointId: string, now: number): EndpointLive {
    return this.live.get(endpointId)?.live(now) ?? IDLE_ENDPOINT;
  }

  snapshot(now: number): Record<string, EndpointLive> {
    const out: Record<string, EndpointLive> = {};
    for (const [id, e] of this.live) out[id] = e.live(now);
    return out;
  }

  setState(e: LiveEndpoint, state: EndpointState, lastError: string | null, extra: Partial<EndpointRow> = {}): void {
    const now = this.clock();
    const changed = e.row.state !== state;
    const set = { state, lastError, lastCheckedAt: now, updatedAt: now, ...extra };
    updateEndpoint(this.db, e.row.id, set);
    e.row = { ...e.row, ...set };
    if (changed) {
      this.logger.info({ endpoint_id: e.row.id, url: e.row.url, state, reason: lastError ?? undefined }, 'endpoint state');
      this.onChange();
    }
  }

  /** A transport failure seen while dispatching; enough in a row takes the endpoint out. */
  transportFailure(e: LiveEndpoint, message: string): boolean {
    e.consecutiveFailures++;
    if (e.state === 'ready' && e.consecutiveFailures >= UNHEALTHY_AFTER) {
      e.probeFailures = 0;
      e.nextProbeAt = this.clock() + firstProbeDelayMs(this.probeIntervalMs);
      this.setState(e, 'unhealthy', message);
      return true;
    }
    return false;
  }

  probeDue(): void {
    const now = this.clock();
    for (const e of this.live.values()) {
      if (e.probing || e.nextProbeAt > now || e.state === 'disabled' || e.state === 'draining') continue;
      e.probing = true;
      this.probe(e)
        .catch((err) => this.logger.warn({ endpoint_id: e.row.id, err: { message: (err as Error).message } }, 'probe failed'))
        .finally(() => (e.probing = false));
    }
  }

  /** Removed, or parked by an operator, while a probe awaited the server: the probe must not revive it. */
  private parked(e: LiveEndpoint): boolean {
    const state: EndpointState = e.state;
    return !this.live.has(e.row.id) || state === 'disabled' || state === 'draining';
  }

  private async probe(e: LiveEndpoint): Promise<void> {
    const { url, apiKey } = e.row;
    const wasReady = e.state === 'ready';
    let failure: string | null = null;
    let starting = false;
    try {
      const health = await getJson(`${url}/health`, apiKey);
      if (health.status === 503) {
        starting = true;
        failure = '/health answered 503 (the server is still loading)';
      } else if (health.status !== 200) failure = `/health answered ${health.status}`;
    } catch (err) {
      const code = (err as { cause?: { code?: string } }).cause?.code;
      starting = code === 'ECONNREFUSED';
      failure = code === 'ECONNREFUSED' ? 'connection refused' : (err as Error).name === 'TimeoutError' ? 'health probe timed out' : 'health probe failed';
    }
    if (this.parked(e)) return;
    const now = this.clock();
    if (failure) {
      const wait = backoffMs(++e.probeFailures, probeBackoff(this.probeIntervalMs));
      // A server still loading is looked at every interval: it may come up any moment.
      e.nextProbeAt = now + (e.state === 'starting' ? Math.min(wait, this.probeIntervalMs) : wait);
      // A server never seen healthy is still starting; one that was up and stopped answering is unhealthy.
      const next: EndpointState = e.state === 'starting' && (starting || e.row.model === null) ? 'starting' : 'unhealthy';
      this.setState(e, next, failure);
      return;
    }
    e.nextProbeAt = now + this.probeIntervalMs;
    e.probeFailures = 0;
    await this.readServerLoad(e);
    if (wasReady) {
      updateEndpoint(this.db, e.row.id, { lastCheckedAt: now });
      return;
    }
    try {
      const models = await getJson(`${url}/v1/models`, apiKey);
      const model = (models.body as { data?: { id?: string }[] })?.data?.[0]?.id;
      if (models.status !== 200 || typeof model !== 'string') throw new Error(`/v1/models answered ${models.status} without a model`);
      let serverMaxRunning: number | null = e.row.serverMaxRunning;
      try {
        const info = await getJson(`${url}/get_server_info`, apiKey);
        const v = (info.body as { max_running_requests?: unknown })?.max_running_requests;
        if (info.status === 200 && typeof v === 'number' && Number.isInteger(v) && v > 0) serverMaxRunning = v;
      } catch {
        /* optional: not every OpenAI-compatible server has it */
      }
      if (this.parked(e)) return;
      e.consecutiveFailures = 0;
      this.setState(e, 'ready', null, { model, serverMaxRunning });
    } catch (err) {
      e.nextProbeAt = now + firstProbeDelayMs(this.probeIntervalMs);
      this.setState(e, e.state === 'starting' ? 'starting' : 'unhealthy', (err as Error).message.slice(0, 300));
    }
  }

  /** SGLang's own view of its load, when it exposes /metrics; never required. */
  private async readServerLoad(e: LiveEndpoint): Promise<void> {
    try {
      const res = await getJson(`${e.row.url}/metrics`, e.row.apiKey);
      if (res.status !== 200 || typeof res.body !== 'string') return;
      e.server = { running: metricValue(res.body, 'sglang:num_running_reqs'), queued: metricValue(res.body, 'sglang:num_queue_reqs') };
    } catch {
      e.server = { running: null, queued: null };
    }
  }
}
