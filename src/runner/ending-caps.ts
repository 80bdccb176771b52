import type { RunRow } from '../db/schema.js';
import { samplesPerLine } from '../domain/params.js';
import { isDispatchable } from '../domain/statuses.js';
import type { LiveEndpoint } from './endpoints.js';

/**
 * The endpoints' caps for one pump, at the end of the work held to what their servers run at once.
 *
 * Regen refills each endpoint to its cap (its server's running limit plus a waiting-queue band,
 * capacity.ts) as its answers come back. At the end of the work that parks the last samples in the
 * queues of the servers whose answers came back first, behind full slots, while another server's
 * slots go idle, and the last wave ends an answer's length late: in the saturation bench (4 servers
 * × 64 slots, 1 s answers) 13 requests waited in two servers' queues while a third had 13 slots
 * free, 0.9 s of a 21 s run. So for a model whose runs are claimed to their last sample, when what
 * regen still holds of them fits in the servers' queue bands, and at least two servers take them,
 * an endpoint gets no more than its server runs at once (`max_running_requests`; a request asking n
 * answers counts n), and the last samples wait in regen for the first free slot anywhere. Not for
 * conversations: a run whose turns come back to be claimed is not ending when none waits. A server
 * that does not say its running limit keeps its queue.
 */
export function endingCaps(
  endpoints: Iterable<LiveEndpoint>,
  capOf: (e: LiveEndpoint) => number,
  active: readonly RunRow[],
  buffered: (runId: string) => number,
): Map<string, number> {
  const caps = new Map<string, number>();
  const serving: LiveEndpoint[] = [];
  for (const e of endpoints) {
    if (!e.dispatchable) continue;
    caps.set(e.row.id, capOf(e));
    serving.push(e);
  }
  const models = new Map<string, RunRow[]>();
  for (const run of active) {
    if (!isDispatchable(run.status)) continue;
    const runs = models.get(run.model);
    if (runs) runs.push(run);
    else models.set(run.model, [run]);
  }
  const ending = new Map<string, number>();
  for (const [model, runs] of models) {
    if (runs.some((run) => run.pending > 0 || run.regenerate === 'all_assistant')) continue;
    const perRequest = Math.max(...runs.map((run) => samplesPerLine(run.params)));
    const servers = serving.filter((e) => e.serves(model));
    if (servers.length < 2 || servers.some((e) => e.capacity.maxRunning === null)) continue;
    const room = servers.reduce((sum, e) => sum + Math.max(0, caps.get(e.row.id)! - running(e, perRequest)), 0);
    const left = runs.reduce((sum, run) => sum + Math.ceil(buffered(run.id) / perRequest), 0);
    if (left <= room) ending.set(model, perRequest);
  }
  if (ending.size === 0) return caps;
  for (const e of serving) {
    const served = [...models.keys()].filter((model) => e.serves(model));
    if (served.length === 0 || !served.every((model) => ending.has(model))) continue;
    const perRequest = Math.max(...served.map((model) => ending.get(model)!));
    caps.set(e.row.id, Math.min(caps.get(e.row.id)!, running(e, perRequest)));
  }
  return caps;
}

/** The requests a server runs at once, each asking `perRequest` answers. */
function running(e: LiveEndpoint, perRequest: number): number {
  return Math.max(1, Math.floor(e.capacity.maxRunning! / perRequest));
}
