import type { Db } from '../db/client.js';
import { claimSamples, rereadClaim, type ClaimedRow, type ClaimOrder } from '../db/samples.js';
import { AFFINITY_WAIT_MS, MAX_CLAIM, pickForSlot } from './endpoint-choice.js';
import type { ResultWriter } from './results.js';

/** A sample leased for dispatch, with its run, and when it was claimed (performance.now()). */
export interface Claimed extends ClaimedRow {
  runId: string;
  since: number;
}

/** The free slot a sample is taken for: the affinity rule (endpoint-choice.ts pickForSlot) picks which. */
export interface Slot {
  endpointId: string;
  /** Whether an endpoint can take samples now. */
  ready: (endpointId: string) => boolean;
  /** Nothing else is due for the slot: a sample that has waited long enough for its own endpoint may move. */
  moveWaited: boolean;
}

/**
 * A lease outlives any request (a run's request_timeout_ms is at most a day): leases are given
 * back by their owner or by recovery after a restart, never by expiry.
 */
const LEASE_MS = 24 * 3600_000;
/** A run's buffer is refilled once it holds no more than this share of its last claim, so the pump finds samples waiting. */
const REFILL_AT = 0.25;
/**
 * A run's claim under way keeps the slots of the runs behind it (see isClaiming) for twice as long
 * as its claims have lately taken (CLAIM_TIME_DECAY), within these bounds: a claim takes milliseconds on a quiet
 * database, and one held up by a slow database must not idle the fleet for long. A fixed half
 * second was too short on a loaded machine, where claims took seconds: each refill of a
 * high-priority run handed the slots that freed meanwhile to a lower one (test/replicas.test.ts,
 * failing at a load of 12–60; its claims took up to 8 s there, hence the ceiling).
 */
const MIN_HOLD_MS = 500;
const MAX_HOLD_MS = 10_000;
/**
 * A run's claim time is its latest claim's duration, or what the longest before it has decayed to
 * at this rate a claim, if longer: one slow claim holds the slots at once, and quick ones bring
 * the hold back down within a few claims (from 8 s to the floor in ten).
 */
const CLAIM_TIME_DECAY = 0.7;
/**
 * A claim asks at most this many times the pump's own claim size (claimSize: the fleet's free
 * slots, at least half of them) when the run took more than that while its last claim was under
 * way: enough to bridge a slow claim, not so much that one replica holds a run's last samples
 * while another's slots go to a run behind it. Measured under load on the replicas test's fleet
 * (12 slots, claims of 3 to 24): its claims took 67 ms at the median and 0.6 s at the 99th
 * percentile against a slot's answer every 10 ms or so, so a claim asked about a claim time's
 * worth; four times the pump's size covers that.
 */
const MAX_CLAIM_GROWTH = 4;
/** Samples held for busy endpoints do not stop a claim for a free slot elsewhere, up to this many in a buffer. */
const MAX_BUFFERED = 2 * MAX_CLAIM;

interface RunBuffer {
  samples: Claimed[];
  /** How many of the samples are held for an endpoint (affinityEndpointId set). */
  held: number;
  /** The claim under way, if any, and when it began (performance.now()). */
  claiming: Promise<void> | null;
  claimedAt: number;
  /** Bumped when the buffer is given back: a claim that lands after it gives its samples back too. */
  generation: number;
  /** Nothing was due at the last claim this tick. */
  drained: boolean;
  lastClaim: number;
  /** How long this run's claims take, ms (CLAIM_TIME_DECAY). */
  claimMs: number;
  /** Samples taken from the buffer while the last claim was under way. */
  takenWhileClaiming: number;
  /** A slot found the buffer empty while the last claim was under way: the run's claims are slower than its slots. */
  ranDry: boolean;
  /** The same two for the claim under way. */
  takenThisClaim: number;
  emptyThisClaim: boolean;
  /** The last claim found samples: a run with nothing due claims every tick, and those claims hold no slot past MIN_HOLD_MS. */
  lastFound: boolean;
}

/** A claim that failed: it may still have been made (the connection cut at its commit). */
interface Unsettled {
  runId: string;
  buffer: RunBuffer;
  generation: number;
  leaseExpiresAt: number;
  /** The claim's transaction id, once the store had told it (PostgreSQL: rereadClaim). */
  xid: string | null;
  onClaim: () => void;
}

/**
 * Moves into `group` the samples of line `customId` from `samples`: those right after its first
 * (a claim returns a line's answers together), then any a claim added at its end (claimSamples'
 * `groups`), until the group holds `perLine`.
 */
export function takeSiblings(samples: Claimed[], customId: string, perLine: number, group: Claimed[]): void {
  while (group.length < perLine && samples[0]?.customId === customId) group.push(samples.shift()!);
  for (let i = 0; group.length < perLine && i < samples.length; ) {
    if (samples[i].customId === customId) group.push(...samples.splice(i, 1));
    else i++;
  }
}

/**
 * Samples claimed from the database and not yet sent, per run. A claim leases many samples in one
 * transaction; they wait here, the slice first and then in the run's order, for free slots. Claims
 * run in the background, as graphile-worker's local queue fetches jobs: `take` never waits on the
 * database; it hands out what the buffer holds and starts a claim when the buffer runs low, and the
 * pump is woken when the claim lands. A run whose claim found nothing due is left alone until the
 * next tick. Samples given back return to the queue through the result writer, without spending
 * an attempt.
 */
export class ClaimBuffer {
  private readonly buffers = new Map<string, RunBuffer>();
  private unsettled: Unsettled[] = [];
  private settling: Promise<void> | null = null;
  /** The last claim's lease expiry: each claim's is unique, and names it (readClaim). */
  private lastExpiry = 0;

  constructor(
    private readonly db: Db,
    private readonly owner: string,
    private readonly clock: () => number,
    private readonly writer: ResultWriter,
    /** A claim landed: the pump can send its samples, or give the slots it held to other runs. */
    private readonly onClaimed: () => void,
    private readonly onError: (err: unknown) => void,
    /** The endpoints this process drives when only some: a claim leaves the samples whose prefix is cached on another replica's to that one. */
    private readonly drives: () => readonly string[] | null = () => null,
    /**
     * A replica of several: how long a sample whose prefix is cached on an endpoint another
     * replica drives waits for that one before a claim here may take it (claimSamples' `movesAfter`).
     */
    private readonly moveWaitMs = AFFINITY_WAIT_MS,
  ) {}

  private bufferOf(runId: string): RunBuffer {
    let b = this.buffers.get(runId);
    if (!b)
      this.buffers.set(
        runId,
        (b = {
          samples: [],
          held: 0,
          claiming: null,
          claimedAt: 0,
          generation: 0,
          drained: false,
          lastClaim: 0,
          claimMs: 0,
          takenWhileClaiming: 0,
          ranDry: false,
          takenThisClaim: 0,
          emptyThisClaim: false,
          lastFound: false,
        }),
      );
    return b;
  }

  /**
   * A claim of the run's is under way, and began less than twice its claim time ago (MIN_HOLD_MS
   * to MAX_HOLD_MS), or less than MIN_HOLD_MS ago when the last one found nothing.
   */
  isClaiming(runId: string): boolean {
    const b = this.buffers.get(runId);
    if (b?.claiming == null) return false;
    const holdMs = b.lastFound ? Math.min(MAX_HOLD_MS, Math.max(MIN_HOLD_MS, 2 * b.claimMs)) : MIN_HOLD_MS;
    return performance.now() - b.claimedAt < holdMs;
  }

  /** The run had nothing due at its last claim this tick, and holds nothing. */
  isDrained(runId: string): boolean {
    const b = this.buffers.get(runId);
    return b !== undefined && b.drained && b.samples.length === 0;
  }

  /** Samples of the run became due (a conversation's next turn): its next take claims again. */
  due(runId: string): void {
    const b = this.buffers.get(runId);
    if (b) b.drained = false;
  }

  /** A new tick: runs found drained may have samples due again (retries whose backoff ended); failed claims are looked for. */
  newTick(): void {
    for (const b of this.buffers.values()) b.drained = false;
    if (this.unsettled.length) void this.settleOnce();
  }

  /** Looks at the failed claims, one look at a time: a second asked for meanwhile shares the first. */
  private settleOnce(): Promise<void> {
    this.settling ??= this.settle().finally(() => {
      this.settling = null;
    });
    return this.settling;
  }

  /**
   * The next sample of a run from its buffer, with the other answers of its line the buffer holds
   * when the run asks `perLine` > 1 (params.n: sent as one request), or null when it holds none
   * now. A buffer running low starts a claim of `claimSize()` lines (the calibration slice first,
   * then in `order`; see ClaimOrder); `onClaim` runs when a claim lands with samples.
   */
  take(runId: string, claimSize: () => number, onClaim: () => void, order: ClaimOrder, window: number, perLine = 1, slot?: Slot): Claimed[] | null {
    const b = this.bufferOf(runId);
    const first = this.pick(b, slot);
    const group = first ? [first] : null;
    if (first && perLine > 1) {
      takeSiblings(b.samples, first.customId, perLine, group!);
      for (const s of group!.slice(1)) if (s.affinityEndpointId !== null) b.held--;
    }
    if (b.claiming !== null) {
      // Samples held for busy endpoints are not an empty buffer: the run's claims kept up.
      if (group) b.takenThisClaim += group.length;
      else if (b.samples.length === 0) b.emptyThisClaim = true;
    }
    // The next claim starts while the buffer still holds what the slots took during the last one
    // (up to half of it), so that they do not wait on it.
    const ahead = Math.max(b.lastClaim * REFILL_AT, Math.min(b.takenWhileClaiming, b.lastClaim / 2));
    const low = b.samples.length <= ahead || (first === null && b.samples.length < MAX_BUFFERED);
    if (!b.claiming && !b.drained && low) this.refill(runId, b, this.claimLimit(b, claimSize() * perLine), onClaim, order, window, perLine > 1);
    return group;
  }

  /**
   * How many samples the next claim asks: `base` (the pump's claim size), or, for a run whose slots
   * outran its last claim, twice that claim; for one whose slots took much while it ran, twice
   * that; never more than MAX_CLAIM_GROWTH times `base`.
   */
  private claimLimit(b: RunBuffer, base: number): number {
    const wanted = b.ranDry ? 2 * b.lastClaim : 2 * b.takenWhileClaiming;
    return Math.min(MAX_CLAIM_GROWTH * base, Math.max(base, wanted));
  }

  /** The sample the slot takes: the first, unless some are held for an endpoint (pickForSlot). */
  private pick(b: RunBuffer, slot: Slot | undefined): Claimed | null {
    if (b.held === 0 || !slot) return this.taken(b, b.samples.length ? 0 : -1);
    return this.taken(b, pickForSlot(b.samples, slot.endpointId, slot.ready, performance.now(), slot.moveWaited));
  }

  private taken(b: RunBuffer, i: number): Claimed | null {
    if (i < 0) return null;
    const [sample] = i === 0 ? [b.samples.shift()!] : b.samples.splice(i, 1);
    if (sample.affinityEndpointId !== null) b.held--;
    return sample;
  }

  private refill(runId: string, b: RunBuffer, limit: number, onClaim: () => void, order: ClaimOrder, window: number, groups: boolean): void {
    if (limit <= 0) return;
    const generation = b.generation;
    const now = this.clock();
    const leaseExpiresAt = (this.lastExpiry = Math.max(now + LEASE_MS, this.lastExpiry + 1));
    let xid: string | null = null;
    b.claimedAt = performance.now();
    b.takenThisClaim = 0;
    b.emptyThisClaim = false;
    // The claim is over before its samples land: a pump they start sees no claim under way, and
    // starts the next one when the buffer runs low.
    b.claiming = this.claim(
      { runId, owner: this.owner, now, leaseExpiresAt, limit, order, window, groups, drives: this.drives(), movesAfter: now - this.moveWaitMs },
      (id) => {
        xid = id;
      },
    ).then(
      (rows) => {
        b.claiming = null;
        b.lastClaim = limit;
        this.claimEnded(b, rows.length > 0);
        if (rows.length === 0) b.drained = true;
        this.land(runId, b, generation, rows, onClaim);
      },
      (err: unknown) => {
        b.claiming = null;
        this.claimEnded(b, false);
        // Tried again next tick: a busy database must not be asked again at once by every pump.
        b.drained = true;
        // Failed as seen from here; made, perhaps, on the server. Read again on the next ticks.
        this.unsettled.push({ runId, buffer: b, generation, leaseExpiresAt, xid, onClaim });
        this.onError(err);
        // The slots this claim held go to the runs behind it.
        this.onClaimed();
      },
    );
  }

  /** The claim statement (db/samples.ts claimSamples); a test stands in for a database whose claims take seconds. */
  protected claim(c: Parameters<typeof claimSamples>[1], began: (xid: string) => void): Promise<ClaimedRow[]> {
    return claimSamples(this.db, c, began);
  }

  /** A claim of the buffer's ended: its duration updates the claim time; what its slots took meanwhile, and whether they found none, size the next. */
  private claimEnded(b: RunBuffer, found: boolean): void {
    b.lastFound = found;
    const took = performance.now() - b.claimedAt;
    b.claimMs = Math.max(took, CLAIM_TIME_DECAY * b.claimMs);
    b.takenWhileClaiming = b.takenThisClaim;
    b.ranDry = b.emptyThisClaim;
  }

  /** landed(), whose failure is not the claim's: its samples are in the buffer, not to be read again. */
  private land(runId: string, b: RunBuffer, generation: number, rows: ClaimedRow[], onClaim: () => void): void {
    try {
      this.landed(runId, b, generation, rows, onClaim);
    } catch (err) {
      this.onError(err);
    }
  }

  /** Claimed samples reach their buffer, or go back to the queue if it was given back meanwhile. */
  private landed(runId: string, b: RunBuffer, generation: number, rows: ClaimedRow[], onClaim: () => void): void {
    const since = performance.now();
    const claimed = rows.map((r) => ({ ...r, runId, since }));
    if (this.buffers.get(runId) !== b || b.generation !== generation) {
      for (const s of claimed) this.giveBack(s);
      this.onClaimed();
      return;
    }
    if (claimed.length) {
      b.samples.push(...claimed);
      for (const c of claimed) if (c.affinityEndpointId !== null) b.held++;
      onClaim();
    }
    // With nothing due, the slots held for this claim go to the runs behind it now, not at the next tick.
    this.onClaimed();
  }

  /**
   * Reads the failed claims again: the samples of one that was made after all are sent (or given
   * back), where they would otherwise stay leased to this process until a restart. A claim that
   * cannot be read now is read on a later tick.
   */
  private async settle(): Promise<void> {
    for (const u of [...this.unsettled]) {
      let rows: ClaimedRow[] | null;
      try {
        rows = await rereadClaim(this.db, { runId: u.runId, owner: this.owner, leaseExpiresAt: u.leaseExpiresAt, xid: u.xid });
      } catch (err) {
        this.onError(err);
        return;
      }
      // Still being committed (or the database cannot say yet): looked at again on a later tick.
      if (rows === null) continue;
      this.unsettled = this.unsettled.filter((x) => x !== u);
      this.land(u.runId, u.buffer, u.generation, rows, u.onClaim);
    }
  }

  /** Runs that hold claimed samples or have a claim under way. */
  runs(): string[] {
    return [...this.buffers].filter(([, b]) => b.samples.length > 0 || b.claiming).map(([runId]) => runId);
  }

  private giveBack(s: Claimed): void {
    this.writer.add({ kind: 'release', sampleId: s.id, runId: s.runId, shardIdx: s.shardIdx, endpointId: null });
  }

  /** Gives a run's claimed samples back to the queue, and those of a claim still under way when it lands. */
  release(runId: string): void {
    const b = this.buffers.get(runId);
    if (!b) return;
    this.buffers.delete(runId);
    b.generation++;
    for (const s of b.samples) this.giveBack(s);
    b.samples = [];
    b.held = 0;
  }

  /**
   * Gives everything back, claims under way included, and those of failed claims that were made
   * after all, and commits it: the runner stops. A failed claim that cannot be read now is left to
   * the recovery of the next dispatcher, with every other lease of this process.
   */
  async releaseAll(): Promise<void> {
    const claiming = [...this.buffers.values()].map((b) => b.claiming).filter((c): c is Promise<void> => c !== null);
    for (const runId of [...this.buffers.keys()]) this.release(runId);
    await Promise.allSettled(claiming);
    await this.settling;
    if (this.unsettled.length) await this.settleOnce();
    await this.writer.flush();
  }
}
