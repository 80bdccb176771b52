// @ts-check
/** @type {string[]} */
export const TERMINAL = ['completed', 'failed', 'cancelled'];

/** @param {number | null | undefined} n */
export function num(n) {
  return n == null ? '—' : Number(n).toLocaleString('en-US');
}

/**
 * @param {number | null | undefined} fraction
 * @param {number} [digits]
 */
export function pct(fraction, digits = 1) {
  return `${(100 * (fraction || 0)).toFixed(digits)}%`;
}

/** @param {number | null | undefined} perSecond */
export function rate(perSecond) {
  if (!perSecond) return '0';
  return perSecond >= 100 ? Math.round(perSecond).toLocaleString('en-US') : perSecond.toFixed(1);
}

/**
 * 3725 → "1h 2m", 95 → "1m 35s". The CLI formats durations with this one too (cli/format.ts): the
 * server serves the page nothing outside src/dashboard, so the page cannot import the CLI's modules.
 * @param {number | null | undefined} seconds
 */
export function duration(seconds) {
  if (seconds == null) return '—';
  const s = Math.max(0, Math.round(seconds));
  const d = Math.floor(s / 86400);
  const hr = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  if (d) return `${d}d ${hr}h`;
  if (hr) return `${hr}h ${m}m`;
  if (m) return `${m}m ${s % 60}s`;
  return `${s}s`;
}

/**
 * The unit a run's progress and its rate count: a conversation run's (`regenerate: "all_assistant"`)
 * are its conversations, whose turns are counted apart (`turns`).
 * @param {{ turns?: unknown }} run
 */
export const unitOf = (run) => (run.turns ? 'conversations' : 'samples');

/**
 * The answers a line asks for (params.n), 1 when it asks one.
 * @param {{ params?: unknown, turns?: unknown }} run
 */
export function answersPerLine(run) {
  const n = /** @type {Record<string, unknown>} */ (run.params ?? {}).n;
  return typeof n === 'number' && Number.isInteger(n) && n > 1 ? n : 1;
}

/**
 * What one request of the run is: a conversation's turn, a line's request for its n answers, or a sample.
 * @param {{ params?: unknown, turns?: unknown }} run
 */
export const requestUnit = (run) => (run.turns ? 'turns' : answersPerLine(run) > 1 ? 'requests' : 'samples');

/**
 * The share a run's bar shows, and its words: samples done (answered, failed or cancelled), except
 * for a run being or having been cancelled, whose cancelled samples were never answered: its bar
 * shows the answered share.
 * @param {{ status: string, turns?: unknown, request_counts: { total: number, completed: number, failed: number, cancelled: number } }} run
 */
export function answered(run) {
  const c = run.request_counts;
  const unit = unitOf(run);
  if (run.status === 'cancelled' || run.status === 'cancelling') {
    const label = `${num(c.completed)} of ${num(c.total)} ${unit} answered · ${num(c.cancelled)} cancelled`;
    return { count: c.completed, fraction: c.total ? c.completed / c.total : 0, label };
  }
  const done = c.completed + c.failed + c.cancelled;
  return { count: done, fraction: c.total ? done / c.total : 0, label: `${num(done)} of ${num(c.total)} ${unit} done` };
}

/** @param {{ status: string, progress: { eta_seconds?: number | null } }} run */
export function eta(run) {
  if (TERMINAL.includes(run.status)) return 'done';
  if (run.status === 'paused') return 'paused';
  return run.progress.eta_seconds == null ? '—' : duration(run.progress.eta_seconds);
}

/** @param {string | null | undefined} isoTime */
export function when(isoTime) {
  if (!isoTime) return '—';
  const d = new Date(isoTime);
  const ago = (Date.now() - d.getTime()) / 1000;
  if (ago < 60) return 'just now';
  if (ago < 86400) return `${duration(ago).split(' ')[0]} ago`;
  return d.toLocaleDateString();
}

/** A moment to come: its clock time, and the date when it is not today. */
/** @param {string | null | undefined} isoTime */
export function at(isoTime) {
  if (!isoTime) return '—';
  const d = new Date(isoTime);
  const time = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  return d.toDateString() === new Date().toDateString() ? time : `${d.toLocaleDateString()} ${time}`;
}

/** @param {number | null | undefined} n */
export function ms(n) {
  if (n == null) return '—';
  return n >= 10_000 ? `${(n / 1000).toFixed(1)} s` : `${Math.round(n)} ms`;
}

/** @param {{ id: string, name?: string | null }} run */
export function runTitle(run) {
  return run.name || run.id;
}

/**
 * The status a run is shown with: a completed run with warnings (a flagged share over the gate's
 * limit) is `completed_with_warnings`, in the warning colour, not green.
 * @param {{ status: string, warnings?: { message: string }[] }} run
 */
export function shownStatus(run) {
  return run.status === 'completed' && run.warnings?.length ? 'completed_with_warnings' : run.status;
}

/**
 * A run the quality gate stopped: resuming it again needs the override.
 * @param {{ status: string, status_reason?: string | null }} run
 */
export function pausedByGate(run) {
  return run.status === 'paused' && /^quality gate/i.test(run.status_reason ?? '');
}
