import { randomUUID } from 'node:crypto';
import { createReadStream, statSync } from 'node:fs';
import { basename } from 'node:path';
import type { components } from '../client/index.js';
import { calibrationSeqs, DEFAULT_CALIBRATION_SAMPLES, MAX_CALIBRATION_SAMPLES } from '../domain/forecast.js';
import { type RegenerateMode, samplesPerLine } from '../domain/run-settings.js';
import { parseInputLine, readLines } from '../domain/input-line.js';
import { Client, UsageError, type ClientOptions } from './client.js';
import { duration, num, rate, TERMINAL } from './format.js';
import { parseParams } from './params.js';
import { checkRun, createRun } from './submit.js';

type Run = components['schemas']['Run'];

export interface PlanOptions extends ClientOptions {
  model: string;
  param: string[];
  samples?: number;
  deadline?: number;
  endpoints?: number;
  regenerate?: RegenerateMode;
}

/** How often the dry run is looked at while it answers its slice. */
const POLL_MS = 500;

const LABEL_WIDTH = 20;

/** The longest line read, as the server's default (REGEN_MAX_LINE_BYTES): a longer one is reported, not held. */
const MAX_LINE_BYTES = 16 * 1024 * 1024;

/** What the dry run answered stands for: the file's line count, of which the sample is `sampled`. */
export interface PlanScope {
  lines: number;
  sampled: number;
  deadline?: number;
  endpoints?: number;
}

/**
 * An interval as a person reads it: one figure when both ends are the same (every calibration
 * answer had one length) or read the same once rounded, never "1d 4h to 1d 4h".
 */
function interval(estimate: number, low: number | null, high: number | null): string {
  if (low === null || high === null) return duration(estimate);
  if (low === high) return `about ${duration(estimate)} (every calibration answer the same length)`;
  if (duration(low) === duration(high)) return `about ${duration(estimate)} (the 90% interval is narrower than that figure's precision)`;
  return `${duration(estimate)} (90% interval ${duration(low)} to ${duration(high)})`;
}

/**
 * The dry run's forecast, of its sample, scaled to the whole file. Every figure of a dry run's
 * forecast is the sample's samples times a mean (tokens, wall time, either end of the interval:
 * domain/forecast.ts), so each scales by lines / sampled; on N endpoints like the ones measured,
 * the wall time is the fleet's times its endpoints over N.
 */
export function describePlan(run: Run, scope: PlanScope): string {
  const f = run.forecast;
  if (!f) return `run ${run.id} ended ${run.status} without a forecast${run.status_reason ? `: ${run.status_reason}` : ''}`;
  const scale = scope.lines / scope.sampled;
  const { endpoints, completion_tokens_per_second: tps } = f.fleet;
  const rows: [string, string][] = [
    ...whatIsAsked(run, scope),
    ['uploaded', scope.sampled < scope.lines ? `a sample of ${num(scope.sampled)} lines, one at random in each of as many equal stretches` : 'the whole file'],
    ['completion tokens', num(Math.round(f.completion_tokens_estimate * scale))],
  ];
  if (f.wall_seconds_estimate === null || endpoints === 0) {
    rows.push(['wall time', '- (no endpoint answered: the fleet has no measured rate)']);
    return format(rows);
  }
  const on = (n: number) => (x: number | null) => (x === null ? null : (x * scale * endpoints) / n);
  const wall = on(endpoints)(f.wall_seconds_estimate)!;
  const endpointHours = (wall * endpoints) / 3600;
  rows.push(
    ['fleet', `${num(endpoints)} endpoint(s), ${rate(tps)} completion tokens/s at their caps`],
    ['wall time', interval(wall, on(endpoints)(f.low), on(endpoints)(f.high))],
  );
  if (scope.endpoints !== undefined) {
    const n = scope.endpoints;
    rows.push([`on ${num(n)} endpoint(s)`, `${interval(on(n)(f.wall_seconds_estimate)!, on(n)(f.low), on(n)(f.high))}, like the ones measured`]);
  }
  rows.push(['endpoint-hours', endpointHours >= 10 ? Math.round(endpointHours).toLocaleString('en-US') : endpointHours.toPrecision(2)]);
  if (scope.deadline !== undefined) {
    rows.push([
      `deadline ${duration(scope.deadline)}`,
      `${num(Math.max(1, Math.ceil((wall * endpoints) / scope.deadline)))} endpoint(s) like the current ones`,
    ]);
  }
  return format(rows);
}

/**
 * What the file asks for, in the run's units: its lines, or its conversations and the requests
 * they take (user turns and tool-call steps, as many a line as the dry run's sample took), and
 * with `n` > 1 the samples, n a line.
 */
function whatIsAsked(run: Run, scope: PlanScope): [string, string][] {
  const f = run.forecast!;
  const basis = `forecast from ${num(f.based_on_samples)} ${run.turns ? 'answered turns' : 'calibration answers'}, dry run ${run.id}`;
  if (run.turns) {
    const turns = Math.round((run.turns.total * scope.lines) / scope.sampled);
    return [
      ['conversations', `${num(scope.lines)} (${basis})`],
      [
        'turns',
        `${scope.sampled < scope.lines ? 'about ' : ''}${num(turns)} requests (user turns and tool-call steps${scope.sampled < scope.lines ? ", at the sample's rate a line" : ''})`,
      ],
    ];
  }
  const n = samplesPerLine(run.params);
  if (n === 1) return [['samples', `${num(scope.lines)} (${basis})`]];
  return [['samples', `${num(scope.lines * n)} (${num(scope.lines)} lines, n = ${n}; ${basis})`]];
}

// A label as long as the column (`on 100,000 endpoint(s)`) still keeps a space before its value.
const format = (rows: [string, string][]) => rows.map(([label, value]) => `${label.padEnd(LABEL_WIDTH - 1)} ${value}`).join('\n');

/**
 * Counts the file's lines (blank ones aside, as the server skips them) and picks `k` of them as a
 * run's calibration slice would: one at random in each of k equal stretches. Two passes over the
 * file, holding only the picked lines. A picked line that is not valid is reported with its line
 * number in the file, not in the sample.
 */
async function sampleFile(file: string, k: number, regenerate: RegenerateMode | null): Promise<{ lines: number; sample: string[] }> {
  const nonBlank = async function* () {
    for await (const raw of readLines(createReadStream(file), { maxLineBytes: MAX_LINE_BYTES })) {
      if ('error' in raw || raw.text.trim() !== '') yield raw;
    }
  };
  let lines = 0;
  for await (const _ of nonBlank()) lines++;
  const picked = new Set(calibrationSeqs(randomUUID(), lines, k));
  const sample: string[] = [];
  let i = 0;
  for await (const raw of nonBlank()) {
    if (picked.has(i++)) {
      if ('error' in raw) throw new UsageError(`${file}: line ${raw.lineNo}: ${raw.error}`);
      const parsed = parseInputLine(raw.text, raw.lineNo, { regenerate });
      if (!parsed.ok) throw new UsageError(`${file}: line ${raw.lineNo}: ${parsed.reason}`);
      sample.push(raw.text);
    }
  }
  return { lines, sample };
}

/**
 * `regen plan FILE --model M`: checks the run, uploads a sample of the file the size of the
 * calibration slice, dry-runs it, waits, and prints the forecast for the whole file.
 */
export async function planCommand(file: string, opts: PlanOptions): Promise<number> {
  try {
    if (!statSync(file).isFile()) throw new Error('not a file');
  } catch {
    throw new UsageError(`cannot read ${file}: not a readable file`);
  }
  const params = parseParams(opts.param);
  const client = new Client(opts);
  const draft = {
    model: opts.model,
    dry_run: true,
    ...(Object.keys(params).length > 0 && { params }),
    ...(opts.regenerate !== undefined && { regenerate: opts.regenerate }),
  };
  await checkRun(client, draft, new Set());
  process.stderr.write(`sampling ${file}\n`);
  const { lines, sample } = await sampleFile(file, opts.samples ?? DEFAULT_CALIBRATION_SAMPLES, opts.regenerate ?? null);
  if (lines === 0) throw new UsageError(`${file}: no lines to plan for`);
  const uploaded = await client.upload(`sample-of-${basename(file)}`, `${sample.join('\n')}\n`);
  // The whole sample is the slice: every line of it is answered (each its params.n answers), and stands for lines / sample of the file.
  const sliceSamples = Math.min(MAX_CALIBRATION_SAMPLES, sample.length * samplesPerLine(params));
  const created = await createRun(client, { ...draft, input: { file_id: uploaded.id }, calibration: { samples: sliceSamples } });
  process.stderr.write(`dry run ${created.id}: answering ${num(sample.length)} of ${num(lines)} lines\n`);
  let run = created;
  while (!TERMINAL.includes(run.status)) {
    await new Promise((r) => setTimeout(r, POLL_MS));
    run = await client.get('/v1/runs/{id}', { params: { path: { id: created.id } } });
    if (run.status === 'paused') {
      process.stderr.write(`regen: dry run ${run.id} is paused: ${run.status_reason ?? 'by an operator'}\n`);
      return 3;
    }
  }
  process.stdout.write(`${describePlan(run, { lines, sampled: sample.length, deadline: opts.deadline, endpoints: opts.endpoints })}\n`);
  return run.status === 'completed' ? 0 : 1;
}
