import { answered as pageAnswered, duration as pageDuration, shownStatus } from '../dashboard/format.js';

// Plain-text rendering for the client commands: numbers, durations and aligned tables.

export const TERMINAL = ['completed', 'failed', 'cancelled'];

/** Statuses in which a run is not answering samples, for a reason worth showing. */
export const WAITING = ['validating', 'queued', 'paused'];

/** A status, with its reason when the run waits: `queued (waiting for an endpoint: …)`. */
export const statusWithReason = (run: { status: string; status_reason: string | null }) =>
  WAITING.includes(run.status) && run.status_reason ? `${run.status} (${run.status_reason})` : run.status;

/** The status a run is shown with, by the page's rule: `completed with warnings` for a completed run over the gate's limit. */
export const runStatus = (run: { status: string; warnings?: { message: string }[] }) => shownStatus(run).replaceAll('_', ' ');

/** A completed run with warnings, for the warning colour. */
export const warned = (run: { status: string; warnings?: { message: string }[] }) => shownStatus(run) === 'completed_with_warnings';

/** Text in the warning colour (yellow) where the stream is a terminal and NO_COLOR is not set. */
export const warnColour = (text: string, stream: NodeJS.WriteStream) => (stream.isTTY && !process.env.NO_COLOR ? `\x1b[33m${text}\x1b[39m` : text);

export const num = (n: number | null | undefined) => (n == null ? '-' : n.toLocaleString('en-US'));

export const pct = (fraction: number, digits = 1) => `${(100 * (fraction || 0)).toFixed(digits)}%`;

export const rate = (perSecond: number) => (perSecond >= 100 ? Math.round(perSecond).toLocaleString('en-US') : (perSecond || 0).toFixed(1));

/** 3725 → "1h 2m", 95 → "1m 35s": the page's formatter, with the terminal's dash for none. */
export const duration = (seconds: number | null | undefined) => (seconds == null ? '-' : pageDuration(seconds));

/**
 * The share a run's progress shows and its count, as the page's bar does: samples done, but for a
 * cancelled (or cancelling) run the samples answered, so a run cancelled early does not read 100%.
 */
export const answered = pageAnswered;

export const ms = (n: number | null | undefined) => (n == null ? '-' : n >= 10_000 ? `${(n / 1000).toFixed(1)} s` : `${Math.round(n)} ms`);

/** Columns padded to their widest cell; `right` lists the columns aligned right (numbers). */
export function table(headers: string[], rows: string[][], right: number[] = []): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (right.includes(i) ? c.padStart(widths[i]) : c.padEnd(widths[i])))
      .join('  ')
      .trimEnd();
  return [line(headers), ...rows.map(line)].join('\n');
}
