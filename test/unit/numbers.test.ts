import { describe, expect, it } from 'vitest';
import { calibrationSeqs, computeForecast, seededRandom, type ForecastInput } from '../../src/domain/forecast.js';

describe('one meaning per number', () => {
  it('the forecast’s basis never shrinks as the run goes', () => {
    const total = 10_000;
    const slice = calibrationSeqs('run_n', total, 200).map((s) => [s, 100 + (s % 97)] as const);
    let last = 0;
    // The dispatch frontier moves through the input; the slice's answers fall behind it one by one.
    for (let frontier = 0; frontier < total; frontier += 250) {
      const f: ForecastInput = {
        whole: false,
        total,
        remaining: total - frontier,
        completionTokens: frontier * 150,
        slice,
        sliceOpen: 0,
        frontier,
        tokensPerSecond: 10_000,
        endpoints: 2,
        elapsedSeconds: frontier / 10,
        deadlineSeconds: null,
        now: frontier,
      };
      const forecast = computeForecast(f, seededRandom(`n:${frontier}`))!;
      expect(forecast.based_on_samples, `at ${frontier}`).toBeGreaterThanOrEqual(last);
      last = forecast.based_on_samples;
    }
    expect(last).toBe(slice.length);
  });
});
