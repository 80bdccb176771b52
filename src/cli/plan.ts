import { statSync } from 'node:fs';
import type { components } from '../client/index.js';
import { Client, UsageError, type ClientOptions } from './client.js';
import { duration, num, rate, TERMINAL } from './format.js';
import { parseParams } from './params.js';
import { createRun, upload } from './submit.js';

type Run = components['schemas']['Run'];

export interface PlanOptions extends ClientOptions {
  model: string;
  param: string[];
  samples?: number;
  deadline?: number;
  regenerate?: 'last_assistant';
}

/** How often the dry run is looked at while it answers its slice. */
const POLL_MS = 500;

const LABEL_WIDTH = 20;

/** The dry run's forecast as a person plans with it. */
export function describePlan(run: Run): string {
  const f = run.forecast;
  if (!f) return `run ${run.id} ended ${run.status} without a forecast${run.status_reason ? `: ${run.status_reason}` : ''}`;
  const { endpoints, completion_tokens_per_second: tps } = f.fleet;
  const rows: [string, string][] = [
    ['samples', `${num(run.request_counts.total)} (forecast from ${num(f.based_on_samples)} calibration answers, dry run ${run.id})`],
    ['completion tokens', num(f.completion_tokens_estimate)],
  ];
  if (f.wall_seconds_estimate === null || endpoints === 0) {
    rows.push(['wall time', '- (no endpoint answered: the fleet has no measured rate)']);
  } else {
    const endpointHours = (f.wall_seconds_estimate * endpoints) / 3600;
    rows.push(
      ['fleet', `${endpoints} endpoint(s), ${rate(tps)} completion tokens/s at their caps`],
      ['wall time', `${duration(f.wall_seconds_estimate)} (90% interval ${duration(f.low)} to ${duration(f.high)})`],
      ['endpoint-hours', endpointHours >= 10 ? Math.round(endpointHours).toLocaleString('en-US') : endpointHours.toPrecision(2)],
    );
    if (run.deadline_seconds !== null) {
      const needed = f.endpoints_for_deadline === null ? '-' : `${f.endpoints_for_deadline} endpoint(s) like the current ones`;
      rows.push([`deadline ${duration(run.deadline_seconds)}`, needed]);
    }
  }
  return rows.map(([label, value]) => `${label.padEnd(LABEL_WIDTH)}${value}`).join('\n');
}

/** `regen plan FILE --model M`: uploads, dry-runs the calibration slice, waits, prints the forecast. */
export async function planCommand(file: string, opts: PlanOptions): Promise<number> {
  try {
    if (!statSync(file).isFile()) throw new Error('not a file');
  } catch {
    throw new UsageError(`cannot read ${file}: not a readable file`);
  }
  const params = parseParams(opts.param);
  const client = new Client(opts);
  process.stderr.write(`uploading ${file}\n`);
  const uploaded = await upload(client, file);
  const created = await createRun(client, {
    model: opts.model,
    input: { file_id: uploaded.id },
    dry_run: true,
    ...(opts.samples !== undefined && { calibration: { samples: opts.samples } }),
    ...(opts.deadline !== undefined && { deadline_seconds: opts.deadline }),
    ...(Object.keys(params).length > 0 && { params }),
    ...(opts.regenerate !== undefined && { regenerate: opts.regenerate }),
  });
  process.stderr.write(`dry run ${created.id}: answering the calibration slice\n`);
  let run = created;
  while (!TERMINAL.includes(run.status)) {
    await new Promise((r) => setTimeout(r, POLL_MS));
    run = await client.get('/v1/runs/{id}', { params: { path: { id: created.id } } });
    if (run.status === 'paused') {
      process.stderr.write(`regen: dry run ${run.id} is paused: ${run.status_reason ?? 'by an operator'}\n`);
      return 3;
    }
  }
  process.stdout.write(`${describePlan(run)}\n`);
  return run.status === 'completed' ? 0 : 1;
}
