// When regen may use a lent server (README "Sharing servers"): windows of the week in the
// endpoint's IANA time zone, and a lend's end. Pure: each replica reads its own clock.

export const WEEKDAYS = ['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'] as const;
export type Weekday = (typeof WEEKDAYS)[number];

/**
 * One window: from `from` to `to` (HH:MM, local time) on each of `days` (every day when absent). A
 * window whose `to` is not after its `from` crosses midnight: it starts on the day named and ends
 * the next morning. `to` "24:00" is the end of the day.
 */
export interface ScheduleWindow {
  days?: Weekday[];
  from: string;
  to: string;
}

/** What an endpoint says of when regen may use it. */
export interface Lending {
  schedule: readonly ScheduleWindow[] | null;
  timezone: string;
  lendUntil: number | null;
}

export const HHMM = /^([01]\d|2[0-3]):[0-5]\d$|^24:00$/;

const MINUTE_MS = 60_000;
const DAY_MINUTES = 24 * 60;
const WEEK_MINUTES = 7 * DAY_MINUTES;
/** How far ahead the next opening is looked for: a week of windows repeats, so one week is enough. */
const LOOKAHEAD_MINUTES = WEEK_MINUTES + DAY_MINUTES;

/** Whether `zone` is an IANA time zone name this runtime knows. */
export function isTimeZone(zone: string): boolean {
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: zone });
    return true;
  } catch {
    return false;
  }
}

const minutesOf = (hhmm: string): number => Number(hhmm.slice(0, 2)) * 60 + Number(hhmm.slice(3, 5));

const formatters = new Map<string, Intl.DateTimeFormat>();

/** The weekday and minute of the day at `at` in `zone`. */
function localTime(at: number, zone: string): { day: number; minute: number } {
  let f = formatters.get(zone);
  if (!f) {
    f = new Intl.DateTimeFormat('en-US', { timeZone: zone, weekday: 'short', hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });
    formatters.set(zone, f);
  }
  const parts = Object.fromEntries(f.formatToParts(at).map((p) => [p.type, p.value]));
  return { day: WEEKDAYS.indexOf(parts.weekday.toLowerCase() as Weekday), minute: Number(parts.hour) * 60 + Number(parts.minute) };
}

/** Whether the local weekday `day` at `minute` falls in the window. */
function inWindow(w: ScheduleWindow, day: number, minute: number): boolean {
  const from = minutesOf(w.from);
  const to = minutesOf(w.to);
  const on = (d: number) => !w.days || w.days.includes(WEEKDAYS[(d + 7) % 7]);
  if (from < to) return on(day) && minute >= from && minute < to;
  // Crossing midnight: the evening of a day named, or the morning after one.
  return (on(day) && minute >= from) || (on(day - 1) && minute < to);
}

/** Whether the schedule lets regen use the endpoint at `at` (no schedule: always). */
function scheduled(schedule: readonly ScheduleWindow[] | null, zone: string, at: number): boolean {
  if (!schedule) return true;
  const { day, minute } = localTime(at, zone);
  return schedule.some((w) => inWindow(w, day, minute));
}

/** Whether regen may send new work to the endpoint at `at`. */
export function lent(l: Lending, at: number): boolean {
  if (l.lendUntil !== null && at >= l.lendUntil) return false;
  return scheduled(l.schedule, l.timezone, at);
}

/**
 * When regen may next send to an endpoint that is off schedule at `at`: the start of its next
 * window (to the minute), or null when none comes (past `lend_until`, or no window within a week).
 */
export function nextOpening(l: Lending, at: number): number | null {
  if (l.lendUntil !== null && at >= l.lendUntil) return null;
  const start = Math.ceil(at / MINUTE_MS) * MINUTE_MS;
  for (let m = 0; m <= LOOKAHEAD_MINUTES; m++) {
    const t = start + m * MINUTE_MS;
    if (l.lendUntil !== null && t >= l.lendUntil) return null;
    if (scheduled(l.schedule, l.timezone, t)) return t;
  }
  return null;
}

/** The most points lentShare samples: a long horizon is sampled more sparsely, not more slowly. */
const MAX_SHARE_SAMPLES = 2000;

/**
 * The share of the time from `from` to `to` that the endpoint is lent, 0 to 1, sampled each minute
 * (each few over a long horizon): what the forecast weighs an endpoint's rate by. An endpoint
 * without a schedule or a lend is lent all of it.
 */
export function lentShare(l: Lending, from: number, to: number): number {
  if (!l.schedule && l.lendUntil === null) return 1;
  const step = Math.max(MINUTE_MS, (to - from) / MAX_SHARE_SAMPLES);
  const samples = Math.max(1, Math.ceil((to - from) / step));
  let open = 0;
  for (let i = 0; i < samples; i++) if (lent(l, from + i * step)) open++;
  return open / samples;
}

/** How regen shares an endpoint with others' traffic (README "Sharing servers"). */
export interface EndpointShare {
  /** Slots kept free for others: regen's cap is at most the server's slots less others' running requests less these. */
  reserve_slots: number;
  /** Others' waiting requests past which regen sends nothing new there. */
  max_other_queue: number;
}
