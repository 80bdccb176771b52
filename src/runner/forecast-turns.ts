import type { DbOrTx } from '../db/client.js';
import { calibrationRequests, requestsOf, turnLengthsByPosition, underwayConversations } from '../db/forecasts.js';
import type { RunRow } from '../db/schema.js';
import { requestCount } from '../domain/conversation.js';
import { positionShares, type TurnPositions } from '../domain/forecast.js';

/**
 * The answered turns' lengths by position are read again at most this often, and at most every
 * 1/POSITION_READS of the run's elapsed time, over at most POSITION_TURNS of them: their shape
 * settles early (the level comes from the run's counters every second), so once a read finds that
 * many the run's shape is kept and never read again, and no read grows with the run.
 */
const POSITIONS_MIN_MS = 5000;
const POSITION_READS = 50;
const POSITION_TURNS = 20_000;

interface RunTurns {
  lengths: { n: number; tokens: number }[];
  lengthsAt: number;
  /** Of each calibration conversation, its requests: a random sample of the input's conversations. */
  sliceCounts: number[] | null;
  /** Requests of each conversation under way, by sample id (their requests never change). */
  counts: Map<number, number>;
}

/** Where a conversation run's remaining turns fall, and its longest chain ahead. */
export interface TurnsAhead {
  positions: TurnPositions;
  /** The longest chain of requests still to run, in mean turns (each position at its length share). */
  longestChain: number;
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
    const settled = r.lengths.reduce((n, p) => n + p.n, 0) >= POSITION_TURNS;
    if (!settled && now - r.lengthsAt >= Math.max(POSITIONS_MIN_MS, elapsed / POSITION_READS)) {
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

    const shares = positionShares(r.lengths);
    const share = (k: number) => shares[k] ?? 1;
    const ahead: number[] = [];
    let longestChain = 0;
    for (const c of underway) {
      let chain = 0;
      for (let k = c.turn; k < counts.get(c.id)!; k++) {
        ahead[k] = (ahead[k] ?? 0) + 1;
        chain += share(k);
      }
      longestChain = Math.max(longestChain, chain);
    }
    const ended = run.completed + run.failed + run.cancelled;
    const unstarted = run.dryRun ? run.total : Math.max(0, run.total - ended - underway.length);
    if (unstarted > 0) {
      // The conversations not started reach each position as the slice's do; the longest of them may be among them.
      const slice = r.sliceCounts.length ? r.sliceCounts : [run.turnsMax];
      for (let k = 0; k < run.turnsMax; k++) ahead[k] = (ahead[k] ?? 0) + (unstarted * slice.filter((n) => n > k).length) / slice.length;
      let chain = 0;
      for (let k = 0; k < run.turnsMax; k++) chain += share(k);
      longestChain = Math.max(longestChain, chain);
    }

    return { positions: { lengths: r.lengths, ahead: Array.from(ahead, (a) => a ?? 0) }, longestChain };
  }
}

function countOf(request: string): number {
  return requestCount((JSON.parse(request) as { messages: { role: string }[] }).messages);
}
