import type { ReplicaRow } from '../../db/replicas.js';
import type { EndpointWithoutIds, FleetShare, RunnerSnapshot } from '../../domain/live-view.js';

/** The other replicas' last published views, and what this process makes of them. */
export class PeerViews {
  private views: RunnerSnapshot[] = [];

  constructor(private readonly owner: string) {}

  /** Takes the views of a fresh read of the replicas, this one's own left out. */
  read(rows: readonly ReplicaRow[]): void {
    this.views = rows.flatMap((r) => (r.owner !== this.owner && r.view ? [r.view] : []));
  }

  /**
   * The whole fleet's view: the rates of all replicas summed, each endpoint as the replica driving
   * it sees it, the coordinator's forecasts.
   */
  merge(own: RunnerSnapshot): RunnerSnapshot {
    for (const view of this.views) {
      for (const [runId, p] of Object.entries(view.runs)) {
        const mine = own.runs[runId];
        own.runs[runId] = mine
          ? {
              samples_per_second: mine.samples_per_second + p.samples_per_second,
              completion_tokens_per_second: mine.completion_tokens_per_second + p.completion_tokens_per_second,
              turns_per_second: (mine.turns_per_second ?? 0) + (p.turns_per_second ?? 0),
              in_flight: (mine.in_flight ?? 0) + (p.in_flight ?? 0),
              samples_in_flight: (mine.samples_in_flight ?? mine.in_flight ?? 0) + (p.samples_in_flight ?? p.in_flight ?? 0),
              turned_away: (mine.turned_away ?? 0) + (p.turned_away ?? 0),
              forecast: mine.forecast ?? p.forecast,
              // Each replica probes the endpoints it drives: together they name every one.
              without_ids: mine.without_ids || p.without_ids ? uniqueEndpoints([...(mine.without_ids ?? []), ...(p.without_ids ?? [])]) : undefined,
            }
          : p;
      }
      for (const [id, e] of Object.entries(view.endpoints)) if (!(id in own.endpoints)) own.endpoints[id] = e;
    }
    return own;
  }

  /** The endpoints some other replica drives, as far as the views tell. */
  drivenElsewhere(): Set<string> {
    return new Set(this.views.flatMap((v) => Object.keys(v.endpoints)));
  }

  /** The endpoints the other replicas drive, their caps and speeds merged, for the forecast. */
  share(): FleetShare {
    const fleet: FleetShare = { caps: {}, speeds: {} };
    for (const view of this.views) {
      Object.assign(fleet.caps, view.fleet?.caps);
      for (const [runId, speeds] of Object.entries(view.fleet?.speeds ?? {})) fleet.speeds[runId] = { ...fleet.speeds[runId], ...speeds };
    }
    return fleet;
  }

  /** Each other replica's share as it published it. */
  shares(): FleetShare[] {
    return this.views.flatMap((v) => (v.fleet ? [v.fleet] : []));
  }
}

/** Each endpoint once: an endpoint whose drive moved is still known to the replica that probed it before. */
const uniqueEndpoints = (list: EndpointWithoutIds[]): EndpointWithoutIds[] => [...new Map(list.map((e) => [e.endpoint_id, e])).values()];
