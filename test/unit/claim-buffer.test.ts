import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { ClaimedRow } from '../../src/db/samples.js';
import { ClaimBuffer } from '../../src/runner/claim-buffer.js';

// The claim buffer's timing: how long a run's claim under way keeps the slots from the runs behind
// it, and how much it asks. A database whose claims take seconds (a loaded machine's, where the
// replicas test failed) cannot be made on demand, so the claim statement is replaced here (a
// subclass's `claim`) by one that lands when the test says; everything else is the buffer's own
// code, on a faked clock.

interface PendingClaim {
  runId: string;
  limit: number;
  /** Lands `rows` samples, each held for `affinity`'s endpoint when given. */
  land(rows: number, affinity?: string): void;
}
const claims: PendingClaim[] = [];
let nextId = 1;

/** The buffer with its claim statement replaced: each claim waits in `claims` until the test lands it. */
class TestBuffer extends ClaimBuffer {
  protected override claim(c: { runId: string; limit: number }): Promise<ClaimedRow[]> {
    return new Promise<ClaimedRow[]>((resolve) => {
      claims.push({
        runId: c.runId,
        limit: c.limit,
        land: (rows, affinity) => resolve(Array.from({ length: rows }, () => ({ ...row(nextId++), affinityEndpointId: affinity ?? null }))),
      });
    });
  }
}

function row(id: number): ClaimedRow {
  return {
    id,
    shardIdx: 0,
    customId: `line-${id}`,
    sampleIndex: 0,
    request: '{}',
    attempts: 0,
    qualityRetries: 0,
    serverFaults: 0,
    variant: null,
    maxTokens: null,
    turn: null,
    affinityEndpointId: null,
  };
}

function buffer() {
  const writer = { add: () => {}, flush: async () => {} };
  return new TestBuffer(
    {} as never,
    'owner',
    () => Date.now(),
    writer as never,
    () => {},
    (err) => {
      throw err;
    },
  );
}

/** A take of the run with a pump claim size of `size`; its claim, when one starts, is the last of `claims`. */
const take = (b: ReturnType<typeof buffer>, runId: string, size = 8) =>
  b.take(
    runId,
    () => size,
    () => {},
    'input',
    1000,
  );

/** Lets the claim's promise callbacks run. */
const settle = () => vi.advanceTimersByTimeAsync(0);

beforeEach(() => {
  claims.length = 0;
  vi.useFakeTimers({ toFake: ['performance', 'Date', 'setTimeout'] });
});
afterEach(() => vi.useRealTimers());

describe('a run’s claim under way and the slots behind it', () => {
  it('holds the slots for twice its last claim’s time when that claim was slow, half a second after a quick one', async () => {
    const b = buffer();
    expect(take(b, 'high')).toBeNull();
    // A quick first claim: the hold is the floor, half a second.
    claims.at(-1)!.land(8);
    await settle();
    for (let i = 0; i < 8; i++) expect(take(b, 'high')).not.toBeNull();
    expect(b.isClaiming('high')).toBe(true);
    await vi.advanceTimersByTimeAsync(600);
    expect(b.isClaiming('high'), 'a quick run’s claim holds half a second').toBe(false);
    // That claim took 0.6 s; the next holds 1.2 s.
    claims.at(-1)!.land(8);
    await settle();
    for (let i = 0; i < 8; i++) take(b, 'high');
    await vi.advanceTimersByTimeAsync(1100);
    expect(b.isClaiming('high'), 'twice the last claim’s 0.6 s').toBe(true);
    await vi.advanceTimersByTimeAsync(200);
    expect(b.isClaiming('high')).toBe(false);
    // A claim of 3 s: the next holds 6 s, at most 10 s.
    await vi.advanceTimersByTimeAsync(1700);
    claims.at(-1)!.land(8);
    await settle();
    for (let i = 0; i < 8; i++) take(b, 'high');
    await vi.advanceTimersByTimeAsync(5900);
    expect(b.isClaiming('high')).toBe(true);
    await vi.advanceTimersByTimeAsync(200);
    expect(b.isClaiming('high')).toBe(false);
  });

  it('holds half a second only after a claim that found nothing, however slow', async () => {
    const b = buffer();
    take(b, 'high');
    await vi.advanceTimersByTimeAsync(3000);
    claims.at(-1)!.land(0);
    await settle();
    // Nothing due: the run is left alone until the next tick, whose claim finds nothing again.
    expect(b.isDrained('high')).toBe(true);
    b.newTick();
    take(b, 'high');
    await vi.advanceTimersByTimeAsync(400);
    expect(b.isClaiming('high')).toBe(true);
    await vi.advanceTimersByTimeAsync(200);
    expect(b.isClaiming('high'), 'a run with nothing due keeps no slot past half a second').toBe(false);
  });
});

describe('how much a claim asks', () => {
  it('the pump’s size while claims keep up; twice the last when the slots found the buffer empty, at most four times the size', async () => {
    const b = buffer();
    take(b, 'run');
    expect(claims.at(-1)!.limit).toBe(8);
    claims.at(-1)!.land(8);
    await settle();
    // Taken down to a quarter: the next claim starts, and asks the pump's size (nothing was taken while the last ran).
    for (let i = 0; i < 6; i++) take(b, 'run');
    expect(claims).toHaveLength(2);
    expect(claims[1].limit).toBe(8);
    // The slots empty the buffer while that claim runs, and find it empty: the next asks twice it.
    for (let i = 0; i < 3; i++) take(b, 'run');
    claims[1].land(8);
    await settle();
    for (let i = 0; i < 8; i++) take(b, 'run');
    expect(claims).toHaveLength(3);
    expect(claims[2].limit).toBe(16);
    for (let i = 0; i < 2; i++) take(b, 'run');
    claims[2].land(16);
    await settle();
    for (let i = 0; i < 16; i++) take(b, 'run');
    expect(claims[3].limit).toBe(32);
    take(b, 'run');
    claims[3].land(32);
    await settle();
    for (let i = 0; i < 32; i++) take(b, 'run');
    expect(claims[4].limit, 'never past four times the pump’s size').toBe(32);
  });

  it('samples held for busy endpoints are not an empty buffer: the claim does not grow', async () => {
    const b = buffer();
    // A slot of another endpoint than the one every sample is held for (its prefix cache), which is up.
    const elsewhere = { endpointId: 'ep_free', ready: () => true, moveWaited: false };
    const takeElsewhere = () =>
      b.take(
        'run',
        () => 8,
        () => {},
        'input',
        1000,
        1,
        elsewhere,
      );
    takeElsewhere();
    claims.at(-1)!.land(8, 'ep_busy');
    await settle();
    // Nothing for this slot, with 8 held: a claim starts for it, and the slot finds none again while it runs.
    expect(takeElsewhere()).toBeNull();
    expect(claims).toHaveLength(2);
    expect(takeElsewhere()).toBeNull();
    claims[1].land(8, 'ep_busy');
    await settle();
    expect(takeElsewhere()).toBeNull();
    expect(claims).toHaveLength(3);
    expect(claims[2].limit, 'the buffer held samples: not a run whose claims fell behind').toBe(8);
  });
});
