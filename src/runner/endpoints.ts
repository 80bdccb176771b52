import type { EndpointWithoutIds } from '../domain/live-view.js';
import { withoutIds } from './id-probe.js';
import type { Db } from '../db/client.js';
import { getEndpoint, listEndpoints, updateEndpoint, updateEndpointIfState } from '../db/endpoints.js';
import { backoffMs, requestBackoff } from '../domain/backoff.js';
import type { EndpointRow } from '../db/schema.js';
import type { EndpointState } from '../domain/statuses.js';
import type { Logger } from '../logger.js';
import { servesIds } from './id-probe.js';
import { Coalesced } from './coalesced.js';
import { IDLE_ENDPOINT, type EndpointLive } from '../domain/live-view.js';
import { LiveEndpoint } from './live-endpoint.js';

export { LiveEndpoint };

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
  /** A shared endpoint's load is read this often, or every loadIntervalMs when that is shorter. */
  sharedLoadIntervalMs: number;
  adaptiveConcurrency: boolean;
  defaultConcurrency: number;
  /** The first wait of a backoff (REGEN_REQUEST_RETRY_MS): a server turning regen away without Retry-After is left alone this long, doubling. */
  requestRetryMs: number;
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
        const joined = new LiveEndpoint(row, this.clock);
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

  /**
   * A row read from the table; a state someone else set (an operator, a re-registration) is probed
   * afresh. `current`: read after one of this pool's writes was refused, so the row as it stands,
   * whatever its updatedAt says.
   */
  private takeRow(e: LiveEndpoint, row: EndpointRow, current = false): void {
    // A read that began before this pool's own last write (a quarantine, a probe's verdict) would
    // put back what that write replaced.
    if (!current && row.updatedAt < e.row.updatedAt) return;
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

  /** Whether some dispatchable endpoint serves the run now: its model, and for a run that writes token ids, not one found to return none. */
  servesNow(run: { model: string; outputTokens: boolean }): boolean {
    for (const e of this.live.values()) if (e.dispatchable && e.serves(run.model) && !(run.outputTokens && e.idMode === 'none')) return true;
    return false;
  }

  /**
   * Whether the endpoints that would serve `model` now are all only turning regen away for a while
   * (429, a gateway's shedding): the run's status says they are busy with other traffic.
   */
  turnedAwayOnly(model: string): boolean {
    let busy = false;
    for (const e of this.live.values()) {
      if (!e.serves(model) || e.state !== 'ready') continue;
      if (!e.driven || e.dispatchable) return false;
      if (e.busy && !e.suspect && !e.offSchedule) busy = true;
    }
    return busy;
  }

  /**
   * The server turned a request away: nothing new is sent there for `retryAfterMs` (its
   * Retry-After), else for the request backoff of the turn-aways in a row, and its cap drops below
   * what it held.
   */
  turnedAway(e: LiveEndpoint, retryAfterMs: number | null): void {
    const inRow = e.yieldCap.turnedAway(this.capOf(e), e.inFlight.size);
    e.busyUntil = Math.max(e.busyUntil, this.clock() + (retryAfterMs ?? backoffMs(inRow, requestBackoff(this.settings.requestRetryMs))));
    this.onChange();
  }

  /** Stops sending `priority` to an endpoint whose server refused it, and says so on the endpoint until an operator sets it again. */
  async refusePriority(e: LiveEndpoint, message: string): Promise<void> {
    if (e.row.priorityRefusedAt !== null) return;
    const at = this.clock();
    e.row = { ...e.row, priorityRefusedAt: at };
    this.logger.warn({ endpoint_id: e.row.id, url: e.row.url, message }, 'the server refuses the priority field: regen sends none there');
    await updateEndpoint(this.db, e.row.id, { priorityRefusedAt: at, updatedAt: at });
  }

  /** Whether `e` may take a sample of `run`: a run that writes token ids only where they come back (id-probe.ts). */
  servesIds(e: LiveEndpoint, run: { outputTokens: boolean; model: string }): boolean {
    return servesIds(e, run, this.logger);
  }

  /** Whether some ready endpoint serves both models: runs of the two then want the same slots. */
  sharedBy(a: string, b: string): boolean {
    for (const e of this.live.values()) if (e.serves(a) && e.serves(b) && (e.dispatchable || (!e.driven && e.state === 'ready'))) return true;
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

  /** The endpoints serving `run`'s model that it is not sent to, as they return no token ids; undefined when none or it writes none. */
  withoutIds(run: { outputTokens: boolean; model: string }): EndpointWithoutIds[] | undefined {
    return withoutIds(this.live.values(), run);
  }

  /** What the endpoints serve, for a run that none can serve: "ep_x (/models/Qwen3-27B, ready)". */
  describeServed(): string {
    if (this.live.size === 0) return 'no endpoints are registered';
    const parts = [...this.live.values()].map((e) => {
      const names = [e.row.model ?? 'model not known yet', ...e.row.aliases].join(', ');
      const state = e.state !== 'ready' ? e.state : e.suspect ? 'being probed' : e.offSchedule ? 'off schedule' : e.busy ? 'busy with other traffic' : e.state;
      return `${e.row.name} (${names}; ${state})`;
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
      // Taken whatever its updatedAt: a re-registration stamps the time it began, which can come
      // before this pool's last verdict, and that row, ignored, held the endpoint at `starting` for
      // good while every probe's write was refused.
      const row = await getEndpoint(db, e.row.id);
      if (row) this.takeRow(e, row, true);
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
