import { describe, expect, it } from 'vitest';
import { CONTENT_SAMPLE_CHARS, ContentCounter, contentKey, DUPLICATE_MIN_COUNT, normaliseContent } from '../../src/domain/content-counter.js';
import { countFlags, flagBit, type Flag } from '../../src/domain/flags.js';
import { bucketLowerBound, LengthHistogram, lengthBucket, SHORT_MIN_SAMPLES } from '../../src/domain/length-histogram.js';
import { ENDPOINT_MIN_SAMPLES, endpointVerdict, QualityWindow, windowsOverLimit, zScore } from '../../src/domain/quality-window.js';
import { gaussian, seeded } from '../support/quality-samples.js';

// The parts of the run's quality gate one by one; run-quality.test.ts drives them together.

const gate = { min_samples: 200, max_flag_rate: 0.2 };
const bit = (f: Flag) => flagBit(f);

describe('normaliseContent and contentKey', () => {
  it('treats case, spacing and trailing punctuation as one text', () => {
    expect(normaliseContent('  OK.  ')).toBe('ok');
    expect(normaliseContent('Yes,\n\n because   it  is.')).toBe('yes, because it is');
    const key = contentKey('OK.');
    for (const variant of ['ok', ' Ok! ', 'OK...', 'OK?\n']) expect(contentKey(variant)).toBe(key);
    expect(contentKey('OK, sure.')).not.toBe(key);
  });

  it('has no key for a blank answer', () => {
    expect(contentKey(null)).toBeNull();
    expect(contentKey('')).toBeNull();
    expect(contentKey(' \n ')).toBeNull();
    expect(contentKey('...')).toBeNull();
  });

  it('tells long answers apart by head, tail and length', () => {
    const body = 'x'.repeat(5000);
    expect(contentKey(`A ${body} Z`)).toBe(contentKey(`A ${body} Z`));
    expect(contentKey(`A ${body} Z`)).not.toBe(contentKey(`B ${body} Z`));
    expect(contentKey(`A ${body} Z`)).not.toBe(contentKey(`A ${body} Y`));
    expect(contentKey(`A ${body} Z`)).not.toBe(contentKey(`A ${body}x Z`));
  });
});

describe('ContentCounter', () => {
  it('flags a text from its DUPLICATE_MIN_COUNT-th copy while the window is small', () => {
    const c = new ContentCounter();
    const seen = Array.from({ length: 12 }, () => c.observe('OK.'));
    expect(seen.map((s) => s.count)).toEqual(Array.from({ length: 12 }, (_, i) => i + 1));
    expect(seen.findIndex((s) => s.flagged)).toBe(DUPLICATE_MIN_COUNT - 1);
  });

  it('needs a share of the window once it is large: 52 copies of 1024', () => {
    const c = new ContentCounter();
    for (let i = 0; i < 1024; i++) c.observe(`answer ${i}`);
    expect(c.threshold()).toBe(52);
    let first = -1;
    for (let i = 0; i < 100 && first < 0; i++) if (c.observe('OK.').flagged) first = i + 1;
    expect(first).toBe(52);
  });

  it('forgets the texts that leave the window', () => {
    const c = new ContentCounter(16);
    for (let i = 0; i < 10; i++) c.observe('OK.');
    expect(c.top()).toEqual({ text: 'OK.', count: 10, share: 1 });
    for (let i = 0; i < 12; i++) c.observe(`answer ${i}`);
    expect(c.size).toBe(16);
    expect(c.top()!.count).toBe(4);
    for (let i = 0; i < 4; i++) c.observe(`more ${i}`);
    expect(c.top()!.count).toBe(1);
  });

  it('leaves blank answers out: they are empty_content', () => {
    const c = new ContentCounter();
    for (let i = 0; i < 50; i++) expect(c.observe(i % 2 ? '' : null)).toEqual({ count: 0, flagged: false });
    expect(c.size).toBe(0);
    expect(c.top()).toBeNull();
  });

  it('keeps a short sample of the text, as first seen', () => {
    const c = new ContentCounter();
    const long = `  I am sorry, but I cannot help with that request because it is against policy.`;
    c.observe(long);
    c.observe(long.toUpperCase());
    expect(c.top()).toEqual({ text: long.trim().slice(0, CONTENT_SAMPLE_CHARS), count: 2, share: 1 });
  });
});

describe('LengthHistogram', () => {
  it('puts each length in one log-spaced bucket', () => {
    expect(lengthBucket(0)).toBe(0);
    expect(lengthBucket(1)).toBe(1);
    for (const t of [1, 2, 3, 10, 100, 4096, 100_000]) {
      const b = lengthBucket(t);
      expect(bucketLowerBound(b)).toBeLessThanOrEqual(t);
      expect(bucketLowerBound(b + 1)).toBeGreaterThan(t);
    }
    expect(lengthBucket(2 ** 30)).toBe(lengthBucket(2 ** 21));
  });

  it('estimates the median within 10%', () => {
    for (const median of [3, 10, 120, 512, 3000, 20_000]) {
      const h = new LengthHistogram();
      const random = seeded(median);
      // A wide log-normal spread around the median (σ 1.5 in log space).
      for (let i = 0; i < 5000; i++) h.add(Math.round(median * Math.exp(1.5 * gaussian(random))));
      expect(Math.abs(h.median()! / median - 1)).toBeLessThan(0.1);
    }
    expect(new LengthHistogram().median()).toBeNull();
  });

  it('calls short only far below the median, under the floor, after enough samples', () => {
    const h = new LengthHistogram();
    for (let i = 0; i < SHORT_MIN_SAMPLES - 1; i++) h.add(512);
    expect(h.isShort(3)).toBe(false);
    h.add(512);
    expect(h.isShort(3)).toBe(true);
    expect(h.isShort(31)).toBe(true);
    expect(h.isShort(32)).toBe(false);
    // A run of short answers: one token is an answer like any other.
    const short = new LengthHistogram();
    for (let i = 0; i < 1000; i++) short.add(10);
    for (let i = 0; i < 1000; i++) short.add(100);
    expect(short.isShort(1)).toBe(false);
    const mid = new LengthHistogram();
    for (let i = 0; i < 1000; i++) mid.add(160);
    expect(mid.isShort(21)).toBe(false);
    expect(mid.isShort(18)).toBe(true);
  });

  it('is rebuilt from (tokens, count) pairs as if each sample were added', () => {
    const one = new LengthHistogram();
    const pairs = new LengthHistogram();
    for (let t = 1; t < 300; t++) for (let k = 0; k < t % 7; k++) one.add(t);
    for (let t = 1; t < 300; t++) pairs.add(t, t % 7);
    expect(pairs.total).toBe(one.total);
    expect(pairs.median()).toBe(one.median());
  });
});

describe('QualityWindow', () => {
  it('keeps the counts of the last samples as they come and go', () => {
    const w = new QualityWindow(50);
    const pushed: number[] = [];
    const random = seeded(7);
    for (let i = 0; i < 500; i++) {
      const flags = random() < 0.3 ? Math.floor(random() * 256) : 0;
      w.push(flags);
      pushed.push(flags);
      const last = pushed.slice(-50);
      expect(w.counts()).toEqual(countFlags(last));
      expect(w.flagged).toBe(last.filter((b) => b !== 0).length);
    }
    expect(w.size).toBe(50);
    expect(w.total).toBe(500);
  });

  it('judges only after min_samples, on the window alone', () => {
    const w = new QualityWindow(400);
    for (let i = 0; i < 199; i++) w.push(bit('empty_content'));
    expect(w.overLimit(gate)).toBe(false);
    w.push(bit('empty_content'));
    expect(w.overLimit(gate)).toBe(true);
    for (let i = 0; i < 400; i++) w.push(i % 5 === 0 ? bit('truncated') : 0);
    expect(w.share).toBe(0.2);
    expect(w.overLimit(gate)).toBe(false);
    expect(w.dominantFlag()).toBe('truncated');
  });

  it('is restored from the newest samples first, as the database returns them', () => {
    const w = new QualityWindow(4);
    const newestFirst = [bit('truncated'), 0, 0, bit('empty_content'), bit('repetitive')];
    w.restore(newestFirst, 10_000);
    expect(w.size).toBe(4);
    expect(w.total).toBe(10_000);
    expect(w.counts()).toMatchObject({ truncated: 1, empty_content: 1, repetitive: 0 });
    // The oldest restored sample (empty_content) is the first to leave.
    w.push(0);
    expect(w.counts()).toMatchObject({ truncated: 1, empty_content: 0 });
    w.restore([]);
    expect([w.size, w.total, w.flagged]).toEqual([0, 0, 0]);
  });
});

describe('endpointVerdict', () => {
  const windowOf = (flagged: number, samples: number, flag: Flag = 'missing_reasoning') => {
    const w = new QualityWindow();
    for (let i = 0; i < samples; i++) w.push(i < flagged ? bit(flag) | (bit('short_for_run') * Number(i % 2 === 0)) : 0);
    return w;
  };

  it('picks one bad endpoint among good ones, with its dominant flag', () => {
    const windows = new Map([
      ['a', windowOf(0, 200)],
      ['b', windowOf(2, 200)],
      ['bad', windowOf(44, 50)],
      ['c', windowOf(1, 200)],
    ]);
    const found = endpointVerdict(windows, gate);
    expect(found).toHaveLength(1);
    expect(found[0]).toMatchObject({ endpointId: 'bad', samples: 50, flag: 'missing_reasoning', flagShare: 0.88, share: 0.88 });
    expect(found[0].peerShare).toBeCloseTo(3 / 600);
  });

  it('waits for ENDPOINT_MIN_SAMPLES on the endpoint and among its peers', () => {
    expect(
      endpointVerdict(
        new Map([
          ['bad', windowOf(40, ENDPOINT_MIN_SAMPLES - 1)],
          ['a', windowOf(0, 200)],
        ]),
        gate,
      ),
    ).toEqual([]);
    expect(
      endpointVerdict(
        new Map([
          ['bad', windowOf(50, 50)],
          ['a', windowOf(0, ENDPOINT_MIN_SAMPLES - 1)],
        ]),
        gate,
      ),
    ).toEqual([]);
    expect(endpointVerdict(new Map([['bad', windowOf(50, 50)]]), gate)).toEqual([]);
  });

  it('picks two bad endpoints of five by their difference from their peers', () => {
    const windows = new Map([
      ['a', windowOf(0, 100)],
      ['bad1', windowOf(87, 100)],
      ['b', windowOf(3, 100)],
      ['bad2', windowOf(80, 100)],
      ['c', windowOf(1, 100)],
    ]);
    expect(endpointVerdict(windows, gate).map((q) => q.endpointId)).toEqual(['bad1', 'bad2']);
  });

  it('leaves endpoints that are all alike to the run gate, and never takes them all', () => {
    const alike = new Map(['a', 'b', 'c'].map((id) => [id, windowOf(80, 100)]));
    expect(endpointVerdict(alike, gate)).toEqual([]);
    const slightlyWorse = new Map([
      ['a', windowOf(10, 400)],
      ['b', windowOf(20, 400)],
    ]);
    expect(endpointVerdict(slightlyWorse, gate)).toEqual([]);
    const two = new Map([
      ['a', windowOf(0, 400)],
      ['bad', windowOf(400, 400)],
    ]);
    expect(endpointVerdict(two, gate).map((q) => q.endpointId)).toEqual(['bad']);
  });

  it('judges an endpoint alone here against the peers other replicas drive, as they count them, and may take it out', () => {
    // PostgreSQL: this replica drives one endpoint; the other replicas' good ones weigh as peers.
    const mine = new Map([['bad', windowOf(44, 50)]]);
    expect(endpointVerdict(mine, gate)).toEqual([]);
    const found = endpointVerdict(mine, gate, [
      { size: 200, flagged: 1 },
      { size: 200, flagged: 2 },
    ]);
    expect(found.map((q) => q.endpointId)).toEqual(['bad']);
    expect(found[0].peerShare).toBeCloseTo(3 / 400);
    // Peers as bad as it: the run's gate decides, not the quarantine.
    expect(endpointVerdict(mine, gate, [{ size: 200, flagged: 170 }])).toEqual([]);
  });

  it("judges a run's window with the windows other replicas keep of it", () => {
    const limit = { min_samples: 200, max_flag_rate: 0.2 };
    // This replica's answers are all from a broken server; the others' are clean: the run is not over its limit.
    const here = windowOf(150, 200);
    expect(here.overLimit(limit)).toBe(true);
    expect(windowsOverLimit(here.total, [here, { size: 400, flagged: 4 }, { size: 400, flagged: 0 }], limit)).toBe(false);
    // Clean here, bad elsewhere: over it; too few samples done yet: not judged.
    expect(windowsOverLimit(200, [windowOf(0, 200), { size: 400, flagged: 300 }], limit)).toBe(true);
    expect(windowsOverLimit(199, [windowOf(0, 200), { size: 400, flagged: 300 }], limit)).toBe(false);
  });

  it('computes the two-proportion z', () => {
    expect(zScore(5, 10, 5, 10)).toBe(0);
    expect(zScore(0, 10, 0, 10)).toBe(0);
    // 50% of 100 against 30% of 100: pooled 40%, se 0.0693.
    expect(zScore(50, 100, 30, 100)).toBeCloseTo(2.887, 3);
  });
});
