import type { DbOrTx } from '../db/client.js';
import { calibrationRequests, type PositionLengths, requestsOf, turnLengthsByPosition, underwayConversations } from '../db/forecasts.js';
import type { RunRow } from '../db/schema.js';
import { requestCount } from '../domain/conversation.js';
import type { TurnPositions } from '../domain/forecast.js';
import type { ConversationsAhead } from '../domain/forecast-chains.js';

/**
 * The answered turns' lengths by position are read again at most this often, and at most every
 * 1/POSITION_READS of the run's elapsed time, over at most POSITION_TURNS of them: their shape
 * settles early (the level comes from the run's counters every second), so once a read finds that
 * many the run's shape is kept and never read again, and no read grows with the run. Until then a
 * read also follows as soon as the run's answered turns have doubled since the last: the first
 * seconds' reads find few, and the spread of lengths (the forecast's uncertainty over a run's
 * longest conversation) would otherwise stay unknown through the first third of a short run.
 */
const POSITIONS_MIN_MS = 5000;
const POSITION_READS = 50;
const POSITION_TURNS = 20_000;

interface RunTurns {
  lengths: PositionLengths[];
  lengthsAt: number;
  /** Of each calibration conversation, its requests: a random sample of the input's conversations. */
  sliceCounts: number[] | null;
  /** Requests of each conversation under way, by sample id (their requests never change). */
  counts: Map<number, number>;
}

/** Where a conversation run's remaining turns fall, and the conversations they belong to. */
export interface TurnsAhead {
  positions: TurnPositions;
  conversations: ConversationsAhead;
  /** The answered requests' spread around their position's mean: standard deviation over the mean of all (0 before two answers). */
  spread: number;
}

/**
 * What the forecast of a conversation run knows of its turns: the answered ones' lengths by
 * position (read every so often), and the requests ahead by position (each second, from the
 * conversations under way, whose request counts it keeps, and the calibration slice's).
 */
export class ForecastTurns {
  private readonly runs = new Map<string, RunTurns>();

  constructor(private readonly db: DbOrTx) {}

  forget(runId: string): void {
    this.runs.delete(runId);
  }

  async read(run: RunRow, now: number): Promise<TurnsAhead> {
    let r = this.runs.get(run.id);
    if (!r) this.runs.set(run.id, (r = { lengths: [], lengthsAt: -Infinity, sliceCounts: null, counts: new Map() }));
    const elapsed = run.startedAt ? now - run.startedAt : 0;
    const read = r.lengths.reduce((n, p) => n + p.n, 0);
    const doubled = run.turnsCompleted >= 2 * Math.max(1, read);
    if (read < POSITION_TURNS && (doubled || now - r.lengthsAt >= Math.max(POSITIONS_MIN_MS, elapsed / POSITION_READS))) {
      r.lengths = await turnLengthsByPosition(this.db, run.id, POSITION_TURNS);
      r.lengthsAt = now;
    }
    r.sliceCounts ??= (await calibrationRequests(this.db, run.id)).map(countOf);
    const underway = run.dryRun ? [] : await underwayConversations(this.db, run.id);
    const unknown = underway.filter((c) => !r.counts.has(c.id)).map((c) => c.id);
    const fresh = unknown.length ? await requestsOf(this.db, unknown) : new Map<number, string>();
    const counts = new Map<number, number>();
    for (const c of underway) counts.set(c.id, r.counts.get(c.id) ?? countOf(fresh.get(c.id) ?? '{"messages":[]}'));
    r.counts = counts;

    const ahead: number[] = [];
    for (const c of underway) for (let k = c.turn; k < counts.get(c.id)!; k++) ahead[k] = (ahead[k] ?? 0) + 1;
    const ended = run.completed + run.failed + run.cancelled;
    const unstarted = run.dryRun ? run.total : Math.max(0, run.total - ended - underway.length);
    // The conversations not started reach each position as the slice's do.
    const slice = r.sliceCounts.length ? r.sliceCounts : [run.turnsMax];
    if (unstarted > 0) for (let k = 0; k < run.turnsMax; k++) ahead[k] = (ahead[k] ?? 0) + (unstarted * slice.filter((n) => n > k).length) / slice.length;

    return {
      positions: { lengths: r.lengths, ahead: Array.from(ahead, (a) => a ?? 0) },
      conversations: { underway: underway.map((c) => ({ next: c.turn, requests: counts.get(c.id)! })), unstarted, requestCounts: slice },
      spread: spreadOf(r.lengths),
    };
  }
}

/** The answered requests' standard deviation around their own position's mean, over the mean of all. */
export function spreadOf(lengths: readonly PositionLengths[]): number {
  let n = 0;
  let tokens = 0;
  let within = 0;
  for (const p of lengths) {
    if (p.n === 0) continue;
    n += p.n;
    tokens += p.tokens;
    within += p.squares - (p.tokens * p.tokens) / p.n;
  }
  return n > 1 && tokens > 0 ? Math.sqrt(Math.max(0, within) / n) / (tokens / n) : 0;
}

function countOf(request: string): number {
  return requestCount((JSON.parse(request) as { messages: { role: string }[] }).messages);
}
