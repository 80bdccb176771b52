import { describe, expect, it } from 'vitest';
import { Ring } from '../../src/domain/ring.js';
import { LatencyRing } from '../../src/runner/rates.js';

describe('Ring', () => {
  it('holds the last capacity numbers and hands back the one each push overwrites', () => {
    const r = new Ring(3);
    expect([r.push(1), r.push(2), r.push(3)]).toEqual([undefined, undefined, undefined]);
    expect(r.size).toBe(3);
    expect(r.push(4)).toBe(1);
    expect(r.push(5)).toBe(2);
    expect([...r.held()].sort()).toEqual([3, 4, 5]);
  });

  it('starts over once cleared', () => {
    const r = new Ring(2);
    r.push(1);
    r.push(2);
    r.clear();
    expect(r.size).toBe(0);
    expect(r.push(7)).toBeUndefined();
    expect([...r.held()]).toEqual([7]);
  });
});

describe('LatencyRing', () => {
  it('gives the median of the last latencies only, numerically', () => {
    const l = new LatencyRing(3);
    expect(l.p50()).toBeNull();
    // Sorted as text, 100 would come before 9; kept, 5000 would make the median 100.
    for (const ms of [5000, 9, 100, 10]) l.add(ms);
    expect(l.p50()).toBe(10);
  });
});
