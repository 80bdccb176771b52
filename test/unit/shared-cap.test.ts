import { describe, expect, it } from 'vitest';
import { sharedCap, type Load, YieldCap } from '../../src/runner/capacity.js';

// regen's cap on a server it shares: the slots others leave, less those kept free for them, and
// nothing new while others queue.

const load = (running: number, waiting: number): Load => ({ at: 0, running, waiting, tokenUsage: null, retracted: null });
const share = { reserve_slots: 2, max_other_queue: 0 };

describe('sharedCap', () => {
  it("is the server's slots less others' running requests less the reserve", () => {
    // 16 slots, 10 running of which regen's 6: others run 4, so regen may hold 16 - 4 - 2.
    expect(sharedCap(share, 16, load(10, 0), 6)).toBe(10);
    // Others alone on the server: regen gets what they leave.
    expect(sharedCap(share, 16, load(12, 0), 0)).toBe(2);
    expect(sharedCap(share, 16, load(16, 0), 0)).toBe(0);
  });

  it("sends nothing while others have more than max_other_queue waiting; regen's own queued requests are not theirs", () => {
    // regen's 18 in flight: 16 running, 2 of its own waiting: others queue none.
    expect(sharedCap(share, 16, load(16, 2), 18)).toBe(16 - 0 - 2);
    // Three waiting beyond regen's own: others queue.
    expect(sharedCap(share, 16, load(16, 5), 18)).toBe(0);
    expect(sharedCap({ reserve_slots: 0, max_other_queue: 3 }, 16, load(16, 5), 18)).toBe(16);
  });
});

describe('YieldCap', () => {
  it('drops below what was in flight at each turn-away and gives one slot back per answer, up to the cap it limits', () => {
    const y = new YieldCap();
    expect(y.limit(40)).toBe(40);
    expect(y.turnedAway(40, 20)).toBe(1);
    expect(y.limit(40)).toBe(17);
    expect(y.turnedAway(40, 17)).toBe(2);
    expect(y.limit(40)).toBe(14);
    y.answered(40);
    expect(y.limit(40)).toBe(15);
    for (let i = 0; i < 30; i++) y.answered(40);
    expect(y.limit(40)).toBe(40);
    // An answer ends a run of turn-aways: the next is the first again.
    expect(y.turnedAway(40, 1)).toBe(1);
    expect(y.limit(40)).toBe(1);
  });
});
