import type { RunnerDeps } from '../deps.js';
import { saveForecast } from '../db/forecasts.js';
import { calibrationAnswers, dispatchFrontier, type SliceAnswer } from '../db/samples.js';
import type { RunRow } from '../db/schema.js';
import { computeForecast, seededRandom, type StoredForecast } from '../domain/forecast.js';
import { samplesPerLine } from '../domain/run-settings.js';
import type { FleetShare } from '../domain/live-view.js';
import type { EndpointPool } from './endpoints.js';
import { ForecastTurns, type TurnsAhead } from './forecast-turns.js';
import { censoredMean, conversationSeconds } from '../domain/forecast-chains.js';
import { positionShares } from '../domain/forecast.js';
import type { Flight } from './requests.js';
import { RateWindow } from './rates.js';
import { lentShare } from '../domain/schedule.js';

/** How often a run's forecast is computed: each costs a few index reads and a bootstrap of the slice. */
const FORECAST_MS = 1000;
/**
 * The forecast history keeps a point at most this often, and at most every 1/HISTORY_POINTS of the
 * run's elapsed time, so a run of days keeps a few thousand points (≈ HISTORY_POINTS × ln of its
 * length over this interval), not one a second.
 */
const HISTORY_MIN_MS = 5000;
const HISTORY_POINTS = 200;

/** An endpoint's calibration answers need this many before their speed stands for the endpoint's. */
const MIN_SLICE_ANSWERS = 10;

/**
 * The weight of each second's reading in a conversation run's wait between turns: about the last
 * ten seconds count, as few conversations are between turns at any one moment.
 */
const WAIT_WEIGHT = 0.1;

/**
 * A run's calibration slice as last read: re-read while some of it is still open, kept once it is
 * all answered. `speed`: per endpoint, completion tokens over request-milliseconds of its slice answers.
 */
interface Slice {
  answered: SliceAnswer[];
  lengths: [number, number, number | null][];
  speed: Map<string, number>;
  open: number;
}

function readSlice(answered: SliceAnswer[], open: number): Slice {
  const sums = new Map<string, { tokens: number; ms: number; n: number }>();
  for (const [, tokens, ms, endpointId] of answered) {
    const s = sums.get(endpointId) ?? { tokens: 0, ms: 0, n: 0 };
    s.tokens += tokens;
    s.ms += ms;
    s.n++;
    sums.set(endpointId, s);
  }
  const speed = new Map<string, number>();
  for (const [id, s] of sums) if (s.n >= MIN_SLICE_ANSWERS && s.ms > 0) speed.set(id, s.tokens / s.ms);
  return { answered, lengths: answered.map(([seq, tokens, , , variant]) => [seq, tokens, variant]), speed, open };
}

/** Each variant's share of the run's samples (its weight over their sum: the stable choice draws them so), or null without variants. */
function variantShares(run: RunRow): number[] | null {
  if (!run.variants?.length) return null;
  const sum = run.variants.reduce((t, v) => t + v.weight, 0);
  return run.variants.map((v) => v.weight / sum);
}

/** The time left the first pass weighs lent hours over: a day, the cycle of most schedules. */
const LENDING_HORIZON_START_MS = 24 * 3_600_000;
/** Passes of the time left over the lent hours it covers: each moves the horizon to the last pass's answer. */
const LENDING_PASSES = 4;

/**
 * The forecasts of the runs being dispatched: each endpoint's measured token rate for each run, the
 * calibration slice's lengths (bounded by the slice's size; read back from the database after a
 * restart), and the latest forecast, stored on the run's row with a point of history every so often.
 */
export class Forecasts {
  /** Per run, per endpoint: completion tokens and request-milliseconds of its answers over the last minute. */
  private readonly windows = new Map<string, Map<string, RateWindow>>();
  private readonly slices = new Map<string, Slice>();
  private readonly latest = new Map<string, StoredForecast>();
  private readonly computedAt = new Map<string, number>();
  private readonly savedAt = new Map<string, number>();
  /** Per conversation run: its conversations waiting between turns and in flight, each smoothed, and when last read. */
  private readonly waits = new Map<string, { at: number; waiting: number; inFlight: number }>();
  private readonly turns: ForecastTurns;

  constructor(
    private readonly deps: RunnerDeps,
    private readonly pool: EndpointPool,
    /** PostgreSQL: what the other replicas publish of the endpoints they drive. */
    private readonly peers: { peersShare(): FleetShare } = { peersShare: () => ({ caps: {}, speeds: {} }) },
    /** The requests this process has in flight: how long a conversation run's turns have been out. */
    private readonly flights: () => Iterable<Flight> = () => [],
  ) {
    this.turns = new ForecastTurns(deps.db);
  }

  /**
   * What this process knows of the endpoints it dispatches to, for the other replicas: each
   * dispatchable one's cap, and per run its answers' tokens per request-millisecond.
   */
  share(now: number): FleetShare {
    const caps: FleetShare['caps'] = {};
    // An endpoint off schedule or turned away for now still counts: the forecast weighs it by its lent hours.
    for (const e of this.pool.live.values()) if (e.serving) caps[e.row.id] = this.pool.capOf(e);
    const speeds: FleetShare['speeds'] = {};
    for (const [runId, perEndpoint] of this.windows) {
      for (const [endpointId, w] of perEndpoint) {
        const r = w.rates(now);
        if (r.samples <= 0 || r.tokens <= 0) continue;
        (speeds[runId] ??= {})[endpointId] = r.tokens / r.samples;
      }
    }
    return { caps, speeds };
  }

  /** An endpoint answered a sample of a run after `latencyMs` with `tokens` completion tokens. */
  answered(runId: string, endpointId: string, tokens: number, latencyMs: number, now: number): void {
    let perEndpoint = this.windows.get(runId);
    if (!perEndpoint) this.windows.set(runId, (perEndpoint = new Map()));
    let w = perEndpoint.get(endpointId);
    if (!w) perEndpoint.set(endpointId, (w = new RateWindow()));
    // The window's "samples" count request-milliseconds here: tokens over them is one slot's speed.
    w.add(now, latencyMs, tokens);
  }

  get(runId: string): StoredForecast | null {
    return this.latest.get(runId) ?? null;
  }

  forget(runId: string): void {
    for (const m of [this.windows, this.slices, this.latest, this.computedAt, this.savedAt, this.waits]) m.delete(runId);
    this.turns.forget(runId);
  }

  /** The run's slice, read again while part of it is still to be answered. */
  async slice(runId: string): Promise<Slice> {
    const known = this.slices.get(runId);
    if (known && known.open === 0) return known;
    const { answered, open } = await calibrationAnswers(this.deps.db, runId);
    const fresh = readSlice(answered, open);
    this.slices.set(runId, fresh);
    return fresh;
  }

  /**
   * The fleet's completion tokens a second for a run, each endpoint at its cap: by Little's law an
   * endpoint holding `cap` requests finishes cap / (mean latency) of them a second, so its rate is
   * cap × (tokens / request-seconds) of its answers. Those are its calibration answers when it gave
   * enough of them: their lengths are a random sample of the input's, where the recent answers of an
   * ordered input are all short (a request's fixed cost weighs more) or all long. Else its answers
   * of the last minute. Summed over the ready endpoints serving the run that have answered it,
   * each weighed by the share of the next `horizonMs` it is lent (schedule, lend_until): a fleet
   * lent by night does a night's work a day.
   */
  async fleetRate(
    run: RunRow,
    now: number,
    horizonMs: number,
  ): Promise<{ tokensPerSecond: number; endpoints: number; slotTokensPerSecond: number; slots: number }> {
    const sliceSpeed = (await this.slice(run.id)).speed;
    // On PostgreSQL the endpoints other replicas drive count as they publish them.
    const own = this.share(now);
    const remote = this.pool.live.size > Object.keys(own.caps).length ? this.peers.peersShare() : { caps: {}, speeds: {} };
    // With params.n > 1 a slot holds one request for a line's n answers, decoded side by side over
    // one prefill: a slice answer's latency is its whole request's, its tokens about 1/n of them,
    // so a slot makes n times its slice answers' speed. (The answers of the last minute are
    // counted a request at a time, all its tokens over its latency, and need no such factor.)
    const perSlot = samplesPerLine(run.params);
    let tokensPerSecond = 0;
    let slotSpeeds = 0;
    let endpoints = 0;
    let slots = 0;
    for (const e of this.pool.live.values()) {
      if (!e.serves(run.model)) continue;
      const from = e.row.id in own.caps ? own : remote;
      const cap = from.caps[e.row.id];
      if (cap === undefined) continue;
      const slice = sliceSpeed.get(e.row.id);
      const perMs = slice !== undefined ? slice * perSlot : from.speeds[run.id]?.[e.row.id];
      if (perMs === undefined) continue;
      tokensPerSecond += cap * perMs * 1000 * lentShare(e.row, now, now + horizonMs);
      slotSpeeds += perMs * 1000;
      slots += cap;
      endpoints++;
    }
    return { tokensPerSecond, endpoints, slotTokensPerSecond: endpoints ? slotSpeeds / endpoints : 0, slots };
  }

  /** Computes the forecast of each run being dispatched, at most once a FORECAST_MS each. */
  async update(active: readonly RunRow[]): Promise<void> {
    const now = this.deps.clock();
    for (const run of active) {
      if (run.status !== 'in_progress' || run.total === 0) continue;
      if (now - (this.computedAt.get(run.id) ?? -Infinity) < FORECAST_MS) continue;
      await this.compute(run, now);
    }
  }

  /** Computes a run's forecast now and stores it; `final` writes a point of history whatever the interval. */
  async compute(run: RunRow, now: number, final = false): Promise<StoredForecast | null> {
    this.computedAt.set(run.id, now);
    const slice = await this.slice(run.id);
    const frontier = run.dryRun ? -1 : await dispatchFrontier(this.deps.db, run.id);
    const turns = run.regenerate === 'all_assistant' ? await this.turns.read(run, now) : null;
    // The time left decides which hours of each endpoint's schedule count, and those the time
    // left: from a day's (a schedule's cycle), each pass weighs the rates over the time the last one found.
    let horizonMs = LENDING_HORIZON_START_MS;
    let forecast: StoredForecast | null = null;
    // The conversations' play does not depend on the horizon (the slots and their speed do not): played once.
    let chainSeconds: number | undefined;
    const chain = (slots: number, slotTokensPerSecond: number) =>
      (chainSeconds ??= turns ? this.conversationSeconds(run, now, turns, slots, slotTokensPerSecond) : 0);
    for (let pass = 0; pass < LENDING_PASSES; pass++) {
      forecast = await this.forecastOver(run, now, slice, frontier, turns, horizonMs, chain);
      const remaining = forecast?.wall_seconds_remaining;
      if (!remaining || !this.lends(run)) break;
      horizonMs = remaining * 1000;
    }
    if (!forecast) return null;
    this.latest.set(run.id, forecast);
    const last = this.savedAt.get(run.id);
    const elapsed = run.startedAt ? now - run.startedAt : 0;
    const due = final || last === undefined || now - last >= Math.max(HISTORY_MIN_MS, elapsed / HISTORY_POINTS);
    // The row always gets the latest, so a run that leaves in_progress (paused, cancelled) shows
    // the forecast of its last second, not of its last history point.
    const done = run.completed + run.failed + run.cancelled;
    await saveForecast(this.deps.db, run.id, forecast, due ? { fraction: run.total ? done / run.total : 0 } : null);
    if (due) this.savedAt.set(run.id, now);
    return forecast;
  }

  /** The run's forecast with the endpoints' rates weighed by their lent share of the next `horizonMs`. */
  private async forecastOver(
    run: RunRow,
    now: number,
    slice: Slice,
    frontier: number,
    turns: TurnsAhead | null,
    horizonMs: number,
    chain: (slots: number, slotTokensPerSecond: number) => number,
  ): Promise<StoredForecast | null> {
    const { tokensPerSecond, endpoints, slotTokensPerSecond, slots } = await this.fleetRate(run, now, horizonMs);
    return computeForecast(
      {
        whole: run.dryRun,
        total: run.total,
        remaining: run.pending + run.inProgress,
        completionTokens: run.completionTokens,
        slice: slice.lengths,
        sliceOpen: slice.open,
        variantShares: variantShares(run),
        frontier,
        tokensPerSecond,
        endpoints,
        elapsedSeconds: run.startedAt ? (now - run.startedAt) / 1000 : 0,
        deadlineSeconds: run.deadlineSeconds,
        now,
        chainSeconds: chain(slots, slotTokensPerSecond),
        ...(turns && {
          // A dry run forecasts every turn; its answered ones are the slice's.
          turns: {
            left: run.dryRun ? run.turnsTotal : run.turnsTotal - run.turnsCompleted - run.turnsFailed,
            answered: run.turnsCompleted,
            tokens: run.completionTokens,
            positions: turns.positions,
          },
        }),
      },
      // Seeded per run and moment: the same figures give the same interval.
      seededRandom(`${run.id}:${now}`),
    );
  }

  /** Some endpoint serving the run is lent for part of the time only. */
  private lends(run: RunRow): boolean {
    for (const e of this.pool.live.values()) if (e.serves(run.model) && (e.row.schedule || e.row.lendUntil !== null)) return true;
    return false;
  }

  /**
   * How long a conversation run's conversations ahead take on the fleet's slots, each request at
   * its position's length at one slot's speed, and the run's wait between turns after it
   * (domain/forecast-chains.ts). The mean length counts the run's requests in flight here as at
   * least what they have generated so far, at that speed: the answered ones alone are the short
   * ones of those sent together.
   */
  private conversationSeconds(run: RunRow, now: number, turns: TurnsAhead, slots: number, slotTokensPerSecond: number): number {
    if (run.turnsCompleted === 0 || slotTokensPerSecond <= 0 || slots <= 0) return 0;
    const bounds: number[] = [];
    // A request out longer than three answered means' worth is stalled or queued at its server, not
    // that long: it counts as that (an hour out would otherwise make every turn four times longer).
    const longest = (3 * run.completionTokens) / run.turnsCompleted;
    for (const f of this.flights()) if (f.run.id === run.id) bounds.push(Math.min(longest, (Math.max(0, now - f.sentAt) / 1000) * slotTokensPerSecond));
    const mean = censoredMean({ n: run.turnsCompleted, tokens: run.completionTokens }, bounds, turns.spread);
    const shares = positionShares(turns.positions.lengths);
    const wait = 1 + this.waitShare(run, now, turns.conversations.underway.length, bounds.length, slots);
    const turnSeconds = Array.from({ length: Math.max(1, run.turnsMax) }, (_, k) => (wait * (shares[k] ?? 1) * mean) / slotTokensPerSecond);
    const seconds = conversationSeconds(turns.conversations, { slots, turnSeconds, spread: turns.spread }, seededRandom(`${run.id}:${now}:conversations`));
    return Number.isFinite(seconds) ? seconds : 0;
  }

  /**
   * A conversation run's wait between a turn's answer and its next request (the answer written,
   * the next turn claimed and sent), as a share of a request's time: while every conversation
   * under way has a slot, one not in flight waits on regen alone, and by Little's law those
   * waiting over those in flight is the wait over the request time. Both are smoothed over the
   * last seconds, and read only where this process sends every request (one replica) and once the
   * run has answered a turn for each conversation under way: before that they wait for the first
   * dispatch, once, not between turns. With more conversations than slots the wait is the fleet's,
   * which the dispatch played forward counts already.
   */
  private waitShare(run: RunRow, now: number, underway: number, inFlight: number, slots: number): number {
    let last = this.waits.get(run.id);
    const alone = [...this.pool.live.values()].every((e) => e.driven || !e.serves(run.model));
    // Not read now (a replica joined, the fleet shrank below the conversations): none is counted,
    // rather than one read when it could be.
    if (!(alone && underway <= slots && inFlight > 0 && run.turnsCompleted >= underway)) return 0;
    if (last?.at !== now) {
      const waiting = Math.max(0, underway - inFlight);
      last = last
        ? { at: now, waiting: last.waiting + WAIT_WEIGHT * (waiting - last.waiting), inFlight: last.inFlight + WAIT_WEIGHT * (inFlight - last.inFlight) }
        : { at: now, waiting, inFlight };
      this.waits.set(run.id, last);
    }
    return last && last.inFlight > 0 ? last.waiting / last.inFlight : 0;
  }
}
