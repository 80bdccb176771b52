import type { ClaimOrder } from '../db/samples.js';
import type { RunRow } from '../db/schema.js';
import { samplesPerLine } from '../domain/run-settings.js';
import { isDispatchable } from '../domain/statuses.js';
import type { ClaimBuffer, Slot } from './claim-buffer.js';
import { claimSize, pickEndpoint } from './endpoint-choice.js';
import type { EndpointPool, LiveEndpoint } from './endpoints.js';
import type { Requests } from './requests.js';

/**
 * How far ahead of its oldest open sample a length-aware run may dispatch, in shards: far enough
 * that the longest samples of the last stretch start waves before the end (a shard is 1,000
 * samples by default, several waves of a fleet), near enough that shards still close one after
 * another, at most this many late.
 */
const LOOKAHEAD_SHARDS = 2;

/** A dry run claims its slice only; a run with predicted lengths may take the longest first. */
function claimOrderOf(run: RunRow): ClaimOrder {
  if (run.dryRun) return 'slice_only';
  return run.dispatchOrder === 'length_aware' && run.predictedSamples > 0 ? 'length_aware' : 'input';
}

function claimSizeFor(pool: EndpointPool, model: string): number {
  const { free, total } = pool.slotsFor(model);
  return claimSize(free, total);
}

/**
 * Fills every free slot of the dispatchable endpoints from the active runs, in their order: each
 * slot goes to the endpoint with the most free room (pickEndpoint), with the first run it serves
 * that has a claimed sample for it. A sample whose prompt is cached on another endpoint waits for
 * that one (endpoint-choice.ts pickForSlot): the slot takes other due work of any run first, and
 * the sample only once it has waited AFFINITY_WAIT_MS; without `affinity` (REGEN_AFFINITY=off) a
 * slot takes its run's next claimed sample. `started` is told of a run's first claim.
 */
export function fillSlots(
  pool: EndpointPool,
  claims: ClaimBuffer,
  requests: Requests,
  active: readonly RunRow[],
  started: (run: RunRow) => void,
  affinity = true,
): void {
  // Caps do not move within one pump; endpoints with free slots but no sample for them leave it.
  const caps = new Map<string, number>();
  for (const e of pool.live.values()) if (e.dispatchable) caps.set(e.row.id, pool.capOf(e));
  const ready = (id: string): boolean => pool.live.get(id)?.holdsAffinity === true;
  for (;;) {
    const best = pickEndpoint(pool.live.values(), (e) => {
      const cap = caps.get(e.row.id);
      return cap === undefined ? null : { cap, inFlight: e.inFlight.size, weight: e.row.weight };
    });
    if (!best) break;
    let offered = offer(best, { endpointId: best.row.id, ready, moveWaited: false });
    if (offered === 'none') offered = offer(best, { endpointId: best.row.id, ready, moveWaited: true });
    if (offered !== 'sent') caps.delete(best.row.id);
  }

  function offer(best: LiveEndpoint, slot: Slot): 'sent' | 'held' | 'none' {
    for (const run of active) {
      if (!isDispatchable(run.status) || !best.serves(run.model) || claims.isDrained(run.id) || !pool.servesIds(best, run)) continue;
      if (requests.reader.avoids(run.id, best.row.id, () => servingIds(pool, run.model))) continue;
      const group = claims.take(
        run.id,
        () => claimSizeFor(pool, run.model),
        () => started(run),
        claimOrderOf(run),
        LOOKAHEAD_SHARDS * run.shardSize,
        samplesPerLine(run.params),
        affinity ? slot : undefined,
      );
      if (!group) {
        // A run ahead in the order whose claim is under way keeps the slot: its claim lands in
        // milliseconds on a quiet database (seconds on a loaded one: the hold follows the run's
        // claim time, ClaimBuffer.isClaiming), where a run behind it would hold the slot for a
        // whole request. Each refill of a high-priority run would otherwise hand a lower one the
        // slots that free meanwhile (a third of the fleet, measured: test/replicas.test.ts).
        if (claims.isClaiming(run.id)) return 'held';
        continue;
      }
      requests.send(best, run, group);
      return 'sent';
    }
    return 'none';
  }
}

/** The endpoints that may take `model`'s samples now, by id: one down or draining is no place to send them instead. */
function* servingIds(pool: EndpointPool, model: string): Iterable<string> {
  for (const e of pool.live.values()) if (e.dispatchable && e.serves(model)) yield e.row.id;
}
