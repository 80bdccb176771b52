import { describe, expect, it } from 'vitest';
import { mulberry32 } from '../../src/domain/forecast.js';
import { censoredMean, conversationSeconds } from '../../src/domain/forecast-chains.js';

// How long a conversation run's conversations ahead take on the fleet's slots (the dispatch played
// forward), and the mean length of its requests when some are still out.

const random = () => mulberry32(37);

describe('the time the conversations ahead take', () => {
  it('is the longest chain when every turn is its mean and every conversation has a slot', () => {
    const ahead = {
      underway: [
        { next: 0, requests: 3 },
        { next: 2, requests: 6 },
        { next: 5, requests: 6 },
      ],
      unstarted: 0,
      requestCounts: [1],
    };
    // Positions of 1, 2, 3, 4, 5, 6 s: the second conversation has 3 + 4 + 5 + 6 = 18 s left.
    const fleet = { slots: 10, turnSeconds: [1, 2, 3, 4, 5, 6], spread: 0 };
    expect(conversationSeconds(ahead, fleet, random())).toBeCloseTo(18, 9);
  });

  it('is the work over the slots when the fleet is the narrow part, with the last slots idle at the end', () => {
    // 10 conversations of 2 turns of 1 s on 2 slots: 20 s of work, 10 s of it on each slot.
    const ahead = { underway: [], unstarted: 10, requestCounts: [2] };
    expect(conversationSeconds(ahead, { slots: 2, turnSeconds: [1], spread: 0 }, random())).toBeCloseTo(10, 9);
    // On 3 slots: three conversations at a time, each second turn before a new conversation (as
    // the runner claims), 2 s each; the tenth conversation runs alone at the end.
    expect(conversationSeconds(ahead, { slots: 3, turnSeconds: [1], spread: 0 }, random())).toBeCloseTo(8, 9);
  });

  it('runs past the mean chain when turns vary: the last of many chains to end is a long one', () => {
    // 60 conversations of 6 turns of 2.5 s each on average: 15 s at the mean, more for the last of them.
    const ahead = { underway: Array.from({ length: 60 }, () => ({ next: 0, requests: 6 })), unstarted: 0, requestCounts: [6] };
    const even = conversationSeconds(ahead, { slots: 60, turnSeconds: [2.5], spread: 0 }, random());
    const uneven = conversationSeconds(ahead, { slots: 60, turnSeconds: [2.5], spread: 0.46 }, random());
    expect(even).toBeCloseTo(15, 9);
    // The expected maximum of 60 sums of six turns with a spread of 0.46: about 15 × (1 + 0.46 / √6 × 2.3).
    expect(uneven).toBeGreaterThan(19);
    expect(uneven).toBeLessThan(26);
  });

  it('plays a part of a large run, the rest at the fleet’s full rate before it', () => {
    // A million conversations of 3 turns of 1 s on 1,000 slots: 3,000 s, whatever part is played.
    const ahead = { underway: [], unstarted: 1_000_000, requestCounts: [3] };
    let draws = 0;
    const counted = random();
    const countingDraws = () => {
      draws++;
      return counted();
    };
    const seconds = conversationSeconds(ahead, { slots: 1000, turnSeconds: [1], spread: 0.3 }, countingDraws);
    expect(seconds).toBeGreaterThan(3000 * 0.99);
    expect(seconds).toBeLessThan(3000 * 1.01);
    // Bounded work, counted in random draws (a conversation's turn count, each request's length: about
    // three a request): playing every conversation would take millions.
    expect(draws).toBeGreaterThan(0);
    expect(draws).toBeLessThan(100_000);
  });

  it('plays a part of a fleet that holds far more conversations under way than can be played, ending about when the whole would', () => {
    // 300,000 conversations under way with 3 turns left each, on 100,000 slots of 1 s turns: 9 s.
    const underway = Array.from({ length: 300_000 }, () => ({ next: 1, requests: 4 }));
    let draws = 0;
    const counted = random();
    const countingDraws = () => {
      draws++;
      return counted();
    };
    // Lengths varying by 1%, so that each request played draws.
    const seconds = conversationSeconds({ underway, unstarted: 0, requestCounts: [4] }, { slots: 100_000, turnSeconds: [1], spread: 0.01 }, countingDraws);
    expect(Math.abs(seconds - 9)).toBeLessThan(0.5);
    expect(draws).toBeLessThan(100_000);
  });

  it('never answers NaN: a slice whose conversations ask nothing, a mean of nothing', () => {
    const seconds = conversationSeconds({ underway: [], unstarted: 70_000, requestCounts: [0, 0] }, { slots: 10, turnSeconds: [1], spread: 0.4 }, random());
    expect(Number.isFinite(seconds)).toBe(true);
    expect(censoredMean({ n: 5, tokens: 0 }, [0], 0.4)).toBe(0);
  });
});

describe('the mean length of requests, some still out', () => {
  it('is the answered mean when none is out or lengths do not vary', () => {
    expect(censoredMean({ n: 10, tokens: 800 }, [], 0.4)).toBe(80);
    expect(censoredMean({ n: 10, tokens: 800 }, [150], 0)).toBe(80);
  });

  it('counts a request out longer than the mean as longer still, and one out briefly as about the mean', () => {
    // 30 answered at a mean of 80; 20 out, each past 100 tokens already: the mean of all is above 100 × 20/50 + 80 × 30/50.
    const long = censoredMean({ n: 30, tokens: 2400 }, Array(20).fill(100), 0.45);
    expect(long).toBeGreaterThan(80 * 0.6 + 100 * 0.4);
    expect(long).toBeLessThan(180);
    // Out for a moment: they say little, and the mean stays near the answered one.
    expect(censoredMean({ n: 30, tokens: 2400 }, Array(20).fill(1), 0.45)).toBeCloseTo(80, -1);
  });
});
