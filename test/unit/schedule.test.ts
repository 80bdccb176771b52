import { describe, expect, it } from 'vitest';
import { isTimeZone, lent, lentShare, nextOpening, type Lending } from '../../src/domain/schedule.js';

// When regen may use a lent endpoint: windows of the week in its time zone, crossing midnight, and
// a lend's end.

const at = (iso: string) => Date.parse(iso);
const nights: Lending = { schedule: [{ days: ['mon', 'tue', 'wed', 'thu', 'fri'], from: '20:00', to: '07:00' }], timezone: 'UTC', lendUntil: null };

describe('lent', () => {
  it('opens in a window that crosses midnight, on the evening of a day named and the morning after it', () => {
    // 2026-12-07 is a Monday.
    expect(lent(nights, at('2026-12-07T19:59:00Z'))).toBe(false);
    expect(lent(nights, at('2026-12-07T20:00:00Z'))).toBe(true);
    expect(lent(nights, at('2026-12-08T06:59:00Z'))).toBe(true);
    expect(lent(nights, at('2026-12-08T07:00:00Z'))).toBe(false);
    // Friday night runs into Saturday morning; Saturday night is not lent, nor Monday's small hours.
    expect(lent(nights, at('2026-12-12T03:00:00Z'))).toBe(true);
    expect(lent(nights, at('2026-12-12T21:00:00Z'))).toBe(false);
    expect(lent(nights, at('2026-12-07T03:00:00Z'))).toBe(false);
  });

  it("reads the windows in the endpoint's time zone", () => {
    const paris: Lending = { ...nights, timezone: 'Europe/Paris' };
    // 19:30 UTC is 20:30 in Paris in December.
    expect(lent(paris, at('2026-12-07T19:30:00Z'))).toBe(true);
    expect(lent(nights, at('2026-12-07T19:30:00Z'))).toBe(false);
  });

  it('ends at lend_until whatever the schedule says, and is always lent without either', () => {
    const until: Lending = { schedule: null, timezone: 'UTC', lendUntil: at('2026-12-07T12:00:00Z') };
    expect(lent(until, at('2026-12-07T11:59:59Z'))).toBe(true);
    expect(lent(until, at('2026-12-07T12:00:00Z'))).toBe(false);
    expect(lent({ schedule: null, timezone: 'UTC', lendUntil: null }, 0)).toBe(true);
  });
});

describe('nextOpening', () => {
  it('is the start of the next window, to the minute, and null past lend_until or when the lend ends first', () => {
    expect(nextOpening(nights, at('2026-12-08T09:15:30Z'))).toBe(at('2026-12-08T20:00:00Z'));
    // Saturday morning after the window: Monday evening.
    expect(nextOpening(nights, at('2026-12-12T08:00:00Z'))).toBe(at('2026-12-14T20:00:00Z'));
    expect(nextOpening({ ...nights, lendUntil: at('2026-12-08T10:00:00Z') }, at('2026-12-08T10:00:00Z'))).toBeNull();
    expect(nextOpening({ ...nights, lendUntil: at('2026-12-08T19:00:00Z') }, at('2026-12-08T10:00:00Z'))).toBeNull();
  });
});

describe('lentShare', () => {
  it("is the share of a span the endpoint is lent: eleven hours a weeknight, none at the weekend's", () => {
    expect(lentShare(nights, at('2026-12-07T12:00:00Z'), at('2026-12-08T12:00:00Z'))).toBeCloseTo(11 / 24, 2);
    expect(lentShare(nights, at('2026-12-12T12:00:00Z'), at('2026-12-13T12:00:00Z'))).toBe(0);
    // A week: five nights of eleven hours.
    expect(lentShare(nights, at('2026-12-07T00:00:00Z'), at('2026-12-14T00:00:00Z'))).toBeCloseTo((5 * 11) / (7 * 24), 2);
    expect(lentShare({ schedule: null, timezone: 'UTC', lendUntil: null }, 0, 1)).toBe(1);
  });
});

it('knows IANA zone names', () => {
  expect(isTimeZone('Europe/Paris')).toBe(true);
  expect(isTimeZone('UTC')).toBe(true);
  expect(isTimeZone('Mars/Olympus')).toBe(false);
});
