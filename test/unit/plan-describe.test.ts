import { describe, expect, it } from 'vitest';
import type { components } from '../../src/client/index.js';
import { describePlan } from '../../src/cli/plan.js';

type Run = components['schemas']['Run'];

/** A dry run of a 200-line sample as the API returns it, with the forecast's figures given. */
function dryRun(forecast: { wall: number; low: number; high: number; tokens: number; endpoints: number }): Run {
  return {
    id: 'run_dry',
    status: 'completed',
    status_reason: null,
    params: {},
    turns: null,
    request_counts: { total: 200, pending: 0, in_progress: 0, completed: 200, failed: 0, cancelled: 0 },
    forecast: {
      computed_at: '2026-12-04T00:00:00.000Z',
      based_on_samples: 200,
      completion_tokens_estimate: forecast.tokens,
      completion_tokens_remaining: forecast.tokens,
      wall_seconds_estimate: forecast.wall,
      wall_seconds_remaining: forecast.wall,
      low: forecast.low,
      high: forecast.high,
      finishes_at: null,
      endpoints_for_deadline: null,
      fleet: { endpoints: forecast.endpoints, completion_tokens_per_second: 1000 },
    },
  } as unknown as Run;
}

const row = (text: string, label: string) =>
  text
    .split('\n')
    .find((l) => l.startsWith(label))
    ?.slice(20);

describe('describePlan', () => {
  it('scales the sample to the whole file and answers for N endpoints', () => {
    // 200 sampled lines of 1,000,000: 5,000 times the sample's figures; on 8 endpoints a quarter of 2.
    const text = describePlan(dryRun({ wall: 20, low: 18, high: 22, tokens: 40_000, endpoints: 2 }), { lines: 1_000_000, sampled: 200, endpoints: 8 });
    expect(row(text, 'samples')).toBe('1,000,000 (forecast from 200 calibration answers, dry run run_dry)');
    expect(row(text, 'uploaded')).toBe('a sample of 200 lines, one at random in each of as many equal stretches');
    expect(row(text, 'completion tokens')).toBe('200,000,000');
    expect(row(text, 'wall time')).toBe('1d 3h (90% interval 1d 1h to 1d 6h)');
    expect(row(text, 'on 8 endpoint(s)')).toBe('6h 56m (90% interval 6h 15m to 7h 38m), like the ones measured');
    expect(row(text, 'endpoint-hours')).toBe('56');
  });

  it("counts the samples of n answers a line, and a conversation file's conversations and requests", () => {
    const three = { ...dryRun({ wall: 20, low: 18, high: 22, tokens: 40_000, endpoints: 2 }), params: { n: 3 } } as Run;
    expect(row(describePlan(three, { lines: 500, sampled: 200 }), 'samples')).toBe(
      '1,500 (500 lines, n = 3; forecast from 200 calibration answers, dry run run_dry)',
    );
    // The sample's 200 conversations took 700 requests: the file's 1,000 about 3,500.
    const conv = { ...dryRun({ wall: 20, low: 18, high: 22, tokens: 40_000, endpoints: 2 }), params: {}, turns: { total: 700 } } as Run;
    conv.forecast!.based_on_samples = 700;
    const text = describePlan(conv, { lines: 1000, sampled: 200 });
    expect(row(text, 'conversations')).toBe('1,000 (forecast from 700 answered turns, dry run run_dry)');
    expect(row(text, 'turns')).toBe("about 3,500 requests (user turns and tool-call steps, at the sample's rate a line)");
    expect(row(describePlan(conv, { lines: 200, sampled: 200 }), 'turns')).toBe('700 requests (user turns and tool-call steps)');
    expect(text).not.toMatch(/^samples/m);
  });

  it('prints endpoint counts with separators, a label as wide as its column still apart from its value', () => {
    const text = describePlan(dryRun({ wall: 20, low: 18, high: 22, tokens: 40_000, endpoints: 1200 }), {
      lines: 1_000_000,
      sampled: 200,
      endpoints: 100_000,
      deadline: 1,
    });
    expect(row(text, 'fleet')).toMatch(/^1,200 endpoint\(s\), /);
    expect(text).toMatch(/^on 100,000 endpoint\(s\) \S/m);
    expect(row(text, 'deadline 1s')).toMatch(/^\d{1,3}(,\d{3})+ endpoint\(s\) like the current ones$/);
  });

  it('counts the endpoints a deadline needs from the scaled wall time', () => {
    const text = describePlan(dryRun({ wall: 20, low: 18, high: 22, tokens: 40_000, endpoints: 2 }), { lines: 1_000_000, sampled: 200, deadline: 86_400 });
    // 100,000 s on 2 endpoints is 200,000 endpoint-seconds: 3 endpoints for a day.
    expect(row(text, 'deadline 1d 0h')).toBe('3 endpoint(s) like the current ones');
  });

  it('prints a degenerate interval as one figure saying why', () => {
    const same = describePlan(dryRun({ wall: 20.2, low: 20.2, high: 20.2, tokens: 40_000, endpoints: 1 }), { lines: 1_000_000, sampled: 200, endpoints: 4 });
    expect(row(same, 'wall time')).toBe('about 1d 4h (every calibration answer the same length)');
    expect(row(same, 'on 4 endpoint(s)')).toBe('about 7h 0m (every calibration answer the same length), like the ones measured');
    const narrow = describePlan(dryRun({ wall: 20.3, low: 20.25, high: 20.35, tokens: 40_000, endpoints: 1 }), { lines: 1_000_000, sampled: 200 });
    expect(row(narrow, 'wall time')).toBe("about 1d 4h (the 90% interval is narrower than that figure's precision)");
  });

  it('says when the whole file was uploaded, and when no endpoint gave a rate', () => {
    const small = describePlan(dryRun({ wall: 20, low: 18, high: 22, tokens: 40_000, endpoints: 1 }), { lines: 150, sampled: 150 });
    expect(row(small, 'uploaded')).toBe('the whole file');
    expect(row(small, 'wall time')).toBe('20s (90% interval 18s to 22s)');
    const none = dryRun({ wall: 20, low: 18, high: 22, tokens: 40_000, endpoints: 0 });
    expect(row(describePlan(none, { lines: 150, sampled: 150 }), 'wall time')).toBe('- (no endpoint answered: the fleet has no measured rate)');
  });
});
