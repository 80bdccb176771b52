import cliProgress from 'cli-progress';
import type { components } from '../client/index.js';
import type { Client } from './client.js';
import { followRun, type RunProgress } from './follow.js';
import { answered, duration, num, pct, rate, runStatus, statusWithReason, warnColour, warned } from './format.js';

type Run = components['schemas']['Run'];

/** Exit codes of a watched run: the shell can tell a finished run from one that needs a person. */
export const EXIT = { completed: 0, ended: 1, gate: 3, interrupted: 130 } as const;

// Paused by a user, a run may be resumed from the dashboard: only the gate's pause ends a watch.
export const pausedByGate = (run: Pick<Run, 'status' | 'status_reason'>) => run.status === 'paused' && /^quality gate/i.test(run.status_reason ?? '');

function payload(run: RunProgress) {
  const c = run.request_counts;
  const p = run.progress;
  const eta = run.status === 'paused' ? 'paused' : p.eta_seconds == null ? '-' : duration(p.eta_seconds);
  return {
    done: num(answered(run).count),
    all: num(c.total),
    pct: pct(answered(run).fraction),
    rate: rate(p.samples_per_second),
    // A conversation run counts conversations as its samples; its turns are the requests.
    unit: run.turns ? `conversations (${num(run.turns.completed)}/${num(run.turns.total)} turns)` : 'samples',
    rate_unit: run.turns
      ? `conversations/s, ${rate(p.turns_per_second ?? 0)} turns/s`
      : p.requests_per_second != null
        ? `samples/s, ${rate(p.requests_per_second)} requests/s`
        : 'samples/s',
    eta_text: eta,
    flags: `${num(run.quality.flagged)} flagged${c.completed ? ` (${pct(run.quality.flagged / c.completed)})` : ''}, ${num(c.failed)} failed`,
    status: statusWithReason(run),
  };
}

/**
 * Follows a run with a live progress bar on stderr until it ends or the quality gate pauses it;
 * resolves to the exit code: 0 completed, 1 failed or cancelled, 3 paused by the gate.
 */
export async function watchRun(client: Client, runId: string): Promise<number> {
  const bar = new cliProgress.SingleBar({
    format: '{bar} {pct} | {done}/{all} {unit} | {rate} {rate_unit} | ETA {eta_text} | {flags} | {status}',
    barCompleteChar: '█',
    barIncompleteChar: '░',
    barsize: 30,
    hideCursor: true,
    emptyOnZero: true,
    noTTYOutput: true,
    notTTYSchedule: 2000,
    stream: process.stderr,
  });
  const abort = new AbortController();
  const onSignal = () => abort.abort();
  process.once('SIGINT', onSignal);
  let started = false;
  let last: RunProgress | null = null;
  try {
    last = await followRun(
      client,
      runId,
      (run) => {
        const c = run.request_counts;
        const done = answered(run).count;
        if (!started) bar.start(c.total, done, payload(run));
        else {
          bar.setTotal(c.total);
          bar.update(done, payload(run));
        }
        started = true;
      },
      abort.signal,
      pausedByGate,
    );
  } finally {
    process.off('SIGINT', onSignal);
    if (started) bar.stop();
  }
  if (abort.signal.aborted || !last) {
    process.stderr.write(`stopped watching; the run goes on (regen status ${runId})\n`);
    return EXIT.interrupted;
  }
  const run = await client.get('/v1/runs/{id}', { params: { path: { id: runId } } });
  process.stderr.write(summary(run) + '\n');
  if (pausedByGate(run)) {
    process.stderr.write(
      `  look at the flagged samples in the dashboard, then: regen runs resume ${run.id} --override-gate (or regen runs cancel ${run.id})\n`,
    );
    return EXIT.gate;
  }
  return run.status === 'completed' ? EXIT.completed : EXIT.ended;
}

function summary(run: Run): string {
  const c = run.request_counts;
  const shown = `run ${run.id} ${pausedByGate(run) ? 'paused by the quality gate' : runStatus(run)} after ${duration(run.progress.elapsed_seconds)}`;
  const head = warned(run) ? warnColour(shown, process.stderr) : shown;
  const counts = `${num(c.completed)} completed, ${num(c.failed)} failed, ${num(run.quality.flagged)} flagged, shards ${num(run.shards.uploaded)}/${num(run.shards.total)}`;
  const lines = [`${head}: ${counts}`];
  if (run.turns) lines.push(`  conversations: ${num(run.turns.completed)} of ${num(run.turns.total)} turns answered, ${num(run.turns.failed)} failed`);
  const reason = run.status_reason ?? run.warnings?.map((w) => w.message).join('; ');
  if (reason) lines.push(`  ${warned(run) ? warnColour(reason, process.stderr) : reason}`);
  if (run.manifest_uri) lines.push(`  manifest: ${run.manifest_uri}`);
  return lines.join('\n');
}
