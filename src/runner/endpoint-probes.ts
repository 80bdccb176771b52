import type { EndpointRow } from '../db/schema.js';
import { PARKED_ENDPOINT_STATES, type EndpointState } from '../domain/statuses.js';
import type { Logger } from '../logger.js';
import { AdaptiveCap, serverCeiling, sharedCap, type Load } from './capacity.js';
import { firstProbeDelayMs, type EndpointPool, type LiveEndpoint, type PoolSettings } from './endpoints.js';
import { parseLoads, parseMetrics, parseModels, parseServerInfo } from './server-info.js';

/** Every probe request but /health: these answer at once on a healthy server. */
const PROBE_TIMEOUT_MS = 5000;
/** A probe reads at most this much of an answer: a server must not fill regen's memory. */
const PROBE_MAX_BYTES = 4 << 20;
/** The adaptive cap's ceiling on a server that does not say what it can run. */
const UNKNOWN_CEILING = 100_000;
const MAX_REASON_CHARS = 300;

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

const REFUSED = 'connection refused';

/**
 * A failed connection said as such, whichever probe request met it, or undefined for another
 * error: never fetch's bare "fetch failed". A kept-alive connection the server dropped (a kill
 * landing between two requests) is undici's "other side closed", or a write into the closed socket.
 */
function connectionFailure(err: unknown): string | undefined {
  switch ((err as { cause?: { code?: string } }).cause?.code) {
    case 'ECONNREFUSED':
      return REFUSED;
    case 'ECONNRESET':
      return 'connection reset';
    case 'UND_ERR_SOCKET':
    case 'EPIPE':
      return 'connection closed by the server';
    default:
      return undefined;
  }
}

type HealthVerdict = { ok: true } | { ok: false; reason: string; loading: boolean };

/**
 * Probes each server the pool's process drives, as SGLANG.md describes it. `/health` is a real
 * one-token generation that can take many seconds on a busy server: a slow or failed probe stops
 * new dispatch there until a probe succeeds, and only `unhealthyAfterProbes` failures in a row make
 * a ready endpoint unhealthy. Neither aborts the requests running there. Each successful probe
 * reads the served model and the capacity again, so a restart or a new model is noticed before
 * anything more is sent; the live load is read every `loadIntervalMs` to steer the cap.
 */
export class EndpointProbes {
  constructor(
    private readonly pool: EndpointPool,
    private readonly logger: Logger,
    private readonly clock: () => number,
    private readonly settings: PoolSettings,
    /** Something dispatch depends on changed: an endpoint cleared, or its cap moved. */
    private readonly onChange: () => void,
    /** An endpoint's drain_grace_ms ran out off schedule: what still runs there is given back. */
    private readonly onDrainOver: (e: LiveEndpoint) => void,
  ) {}

  /** Starts the probes and load readings that are due, on the endpoints this process drives. */
  due(): void {
    const now = this.clock();
    for (const e of this.pool.live.values()) {
      // Another replica drives it: that one probes it.
      if (!e.driven) continue;
      this.drainOffSchedule(e, now);
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

  /**
   * Off schedule or past lend_until, what runs there finishes, or is given back once the endpoint's
   * drain_grace_ms has passed (its samples go to the endpoints still lent, nothing charged).
   */
  private drainOffSchedule(e: LiveEndpoint, now: number): void {
    if (!e.offSchedule) {
      e.offSince = null;
      return;
    }
    e.offSince ??= now;
    if (e.row.drainGraceMs === null || e.inFlight.size === 0 || now - e.offSince < e.row.drainGraceMs) return;
    this.logger.info(
      { endpoint_id: e.row.id, in_flight: e.inFlight.size },
      'off schedule: drain_grace_ms is over, the requests still running go back to the queue',
    );
    this.onDrainOver(e);
  }

  /** Removed, or parked by an operator or the quality gate: probes leave it alone, and must not revive it. */
  private parked(e: LiveEndpoint): boolean {
    return !this.pool.live.has(e.row.id) || PARKED_ENDPOINT_STATES.includes(e.state);
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
      const connection = connectionFailure(err);
      // Refused: nothing listens yet, as while a server starts.
      if (connection) return { ok: false, reason: connection, loading: connection === REFUSED };
      const timedOut = (err as Error).name === 'TimeoutError';
      const cause = (err as { cause?: { message?: string } }).cause?.message;
      return {
        ok: false,
        reason: timedOut ? `health probe timed out after ${Math.round(timeoutMs / 1000)} s` : `health probe failed${cause ? `: ${cause}` : ''}`,
        loading: false,
      };
    }
  }

  private async probe(e: LiveEndpoint): Promise<void> {
    const before = e.row.state;
    // SGLang's /health generates a token: off schedule the GPUs are someone else's, and the
    // reads of /v1/models below tell whether the server is up.
    const verdict: HealthVerdict = e.offSchedule ? { ok: true } : await this.health(e);
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
      const reason = connectionFailure(err) ?? (err as Error).message;
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
    if (!(await this.pool.setState(e, 'ready', null, extra, before))) return;
    e.consecutiveFailures = 0;
    e.unprobed = false;
    if (e.suspect) {
      e.suspect = false;
      this.onChange();
    }
    this.fitCeiling(e);
    // The adaptive cap starts low, before the first load reading, rather than at a running limit
    // that SGLang sets far past what its KV pool holds.
    if (this.settings.adaptiveConcurrency && e.loadRoute !== 'none') e.adaptive ??= new AdaptiveCap(this.ceiling(e), e.capacity);
    if (e.capInfo(this.settings.defaultConcurrency).source === 'default') this.warnDefault(e);
  }

  private async probeFailed(e: LiveEndpoint, before: string, reason: string, loading: boolean): Promise<void> {
    e.unprobed = false;
    const now = this.clock();
    const failures = ++e.probeFailures;
    if (e.state === 'ready') {
      e.suspect = true;
      // Soon again: one slow probe of a busy server should hold its dispatch back briefly, not for long.
      e.nextProbeAt = now + firstProbeDelayMs(this.settings.probeIntervalMs);
      const judged = failures >= this.settings.unhealthyAfterProbes;
      await this.pool.setState(
        e,
        judged ? 'unhealthy' : 'ready',
        `${reason} (${failures} of ${this.settings.unhealthyAfterProbes} probes in a row)`,
        {},
        before,
      );
      return;
    }
    // Every interval, however long it has been down: a refused connection costs nothing, and a
    // server restarted on its address is back in dispatch within one interval.
    e.nextProbeAt = now + this.settings.probeIntervalMs;
    // A server never seen healthy is still starting; one that was up and stopped answering is unhealthy.
    const next: EndpointState = e.state === 'starting' && (loading || e.row.model === null) ? 'starting' : 'unhealthy';
    await this.pool.setState(e, next, reason, {}, before);
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
      e.idMode = null;
      e.idRefusals = 0;
    }
  }

  private ceiling(e: LiveEndpoint): number {
    const server = e.row.serverMaxRunning === null ? UNKNOWN_CEILING : serverCeiling(e.row.serverMaxRunning);
    return Math.min(server, e.row.maxConcurrency ?? Number.POSITIVE_INFINITY);
  }

  private fitCeiling(e: LiveEndpoint): void {
    e.adaptive?.setCeiling(this.ceiling(e), e.capacity);
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

  /** The server's live load: /v1/loads for running, waiting, KV usage and cache hit rate, /metrics for retractions and `sglang:cache_hit_rate`. */
  private async readLoad(e: LiveEndpoint): Promise<void> {
    const { url, apiKey } = e.row;
    const { loadIntervalMs, sharedLoadIntervalMs } = this.settings;
    e.nextLoadAt = this.clock() + (e.row.share ? Math.min(sharedLoadIntervalMs, loadIntervalMs) : loadIntervalMs);
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
        if (m && load) load = { ...load, retracted: m.retracted, retractedNow: m.retractedNow, cacheHitRate: m.cacheHitRate ?? load.cacheHitRate };
        else if (m && e.loadRoute === 'metrics') load = m;
      }
    }
    if (!load) return;
    e.load = load;
    if (e.row.share) {
      const before = e.sharedCap;
      // The server's slots: what it says it runs at once, else what it runs now (a lower bound).
      e.sharedCap = sharedCap(e.row.share, e.row.serverMaxRunning ?? load.running, load, e.inFlight.size);
      if (e.sharedCap !== before) this.onChange();
    } else e.sharedCap = null;
    if (!this.settings.adaptiveConcurrency) return;
    const before = e.adaptive?.cap ?? null;
    e.adaptive ??= new AdaptiveCap(this.ceiling(e), e.capacity);
    e.adaptive.observe(load, e.inFlight.size, e.latency.p50());
    if (e.adaptive.cap !== before) this.onChange();
  }
}
