import { Client, type ClientOptions } from './client.js';

/** `regen runs pause|resume|cancel RUN`: prints the run's status after the change. */
export async function runActionCommand(
  action: 'pause' | 'resume' | 'cancel',
  runId: string,
  opts: ClientOptions & { overrideGate?: boolean },
): Promise<number> {
  const client = new Client(opts);
  const path = { id: runId };
  const run =
    action === 'resume'
      ? await client.post('/v1/runs/{id}/resume', { params: { path }, body: opts.overrideGate ? { override_gate: true } : {} })
      : await client.post(`/v1/runs/{id}/${action}`, { params: { path } });
  process.stdout.write(`${run.id}: ${run.status}${opts.overrideGate ? ' (quality gate overridden)' : ''}\n`);
  return 0;
}
