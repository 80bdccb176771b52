import type { Run } from '../routes/runs/schemas.js';
import { Client, enc, type ClientOptions } from './client.js';

/** `regen runs pause|resume|cancel RUN`: prints the run's status after the change. */
export async function runActionCommand(
  action: 'pause' | 'resume' | 'cancel',
  runId: string,
  opts: ClientOptions & { overrideGate?: boolean },
): Promise<number> {
  const client = new Client(opts);
  const run = await client.post<Run>(`/v1/runs/${enc(runId)}/${action}`, opts.overrideGate ? { override_gate: true } : {});
  process.stdout.write(`${run.id}: ${run.status}${opts.overrideGate ? ' (quality gate overridden)' : ''}\n`);
  return 0;
}
