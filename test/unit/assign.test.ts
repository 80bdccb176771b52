import { describe, expect, it } from 'vitest';
import { ASSIGN_SALTS, pickSplit, pickWeighted, stableFraction } from '../../src/domain/assign.js';

describe('stable assignment', () => {
  const ids = Array.from({ length: 4000 }, (_, i) => `req-${i}`);

  it('gives the same fraction for the same id and salt, and another under another salt', () => {
    expect(stableFraction('a', ASSIGN_SALTS.split)).toBe(stableFraction('a', ASSIGN_SALTS.split));
    expect(stableFraction('a', ASSIGN_SALTS.split)).not.toBe(stableFraction('a', ASSIGN_SALTS.variant));
  });

  it('shares follow the weights within 3 points on 4,000 ids', () => {
    const counts = [0, 0, 0];
    for (const id of ids) counts[pickWeighted(id, [4, 4, 2], ASSIGN_SALTS.variant)]! += 1;
    expect(Math.abs(counts[0]! / ids.length - 0.4)).toBeLessThan(0.03);
    expect(Math.abs(counts[1]! / ids.length - 0.4)).toBeLessThan(0.03);
    expect(Math.abs(counts[2]! / ids.length - 0.2)).toBeLessThan(0.03);
  });

  it('the eval split holds its share within each variant (independent salts)', () => {
    for (const v of [0, 1]) {
      const mine = ids.filter((id) => pickWeighted(id, [1, 1], ASSIGN_SALTS.variant) === v);
      const evalShare = mine.filter((id) => pickSplit(id, 0.1) === 'eval').length / mine.length;
      expect(Math.abs(evalShare - 0.1)).toBeLessThan(0.02);
    }
  });
});
