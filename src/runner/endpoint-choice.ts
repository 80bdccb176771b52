// Which endpoint takes the next sample, and how many samples to claim at once (docs/design.md "Runner").

/** What the choice reads of an endpoint. */
export interface Slots {
  cap: number;
  inFlight: number;
  weight: number;
}

/**
 * The endpoint with the most free room relative to its cap, the heavier one on a tie; null when
 * none has a free slot. Filling the relatively emptiest first keeps a small server as busy as a
 * big one.
 */
export function pickEndpoint<T>(candidates: Iterable<T>, slotsOf: (c: T) => Slots | null): T | null {
  let best: T | null = null;
  let bestRoom = 0;
  let bestWeight = 0;
  for (const c of candidates) {
    const s = slotsOf(c);
    if (!s || s.cap - s.inFlight <= 0) continue;
    const room = (s.cap - s.inFlight) / s.cap;
    if (room > bestRoom || (room === bestRoom && best !== null && s.weight > bestWeight)) {
      best = c;
      bestRoom = room;
      bestWeight = s.weight;
    }
  }
  return best;
}

/** The most samples one run keeps claimed ahead of dispatch. */
export const MAX_CLAIM = 512;

/**
 * How many samples to claim for a run when its buffer is empty: the fleet's free slots, and at
 * least half its slots, so that a claim statement is spread over many requests rather than paid
 * once per freed slot; never more than MAX_CLAIM.
 */
export function claimSize(freeSlots: number, totalSlots: number): number {
  return Math.min(MAX_CLAIM, Math.max(1, freeSlots, Math.ceil(totalSlots / 2)));
}

/**
 * How long a sample held for the endpoint whose prefix cache holds its prompt waits for a slot
 * there before a free slot elsewhere, with nothing else due, takes it (docs/design.md "Runner").
 */
export const AFFINITY_WAIT_MS = 2000;

/** What the affinity rule reads of a claimed sample. */
export interface Waiting {
  affinityEndpointId: string | null;
  /** When it was claimed (ms). */
  since: number;
}

/**
 * Which claimed sample a free slot of `endpointId` takes, by index, or -1 for none. In order: one
 * whose prefix is cached there; one held for no endpoint, or for one that is not ready (so it
 * moves); then, when `moveWaited` (nothing else of any run is due for the slot), the one that has
 * waited longest for its own endpoint, once it has waited AFFINITY_WAIT_MS.
 */
export function pickForSlot(waiting: readonly Waiting[], endpointId: string, ready: (id: string) => boolean, now: number, moveWaited: boolean): number {
  let free = -1;
  let waited = -1;
  for (let i = 0; i < waiting.length; i++) {
    const { affinityEndpointId: home, since } = waiting[i];
    if (home === endpointId) return i;
    if (home === null || !ready(home)) {
      if (free < 0) free = i;
    } else if (moveWaited && now - since >= AFFINITY_WAIT_MS && (waited < 0 || since < waiting[waited].since)) {
      waited = i;
    }
  }
  return free >= 0 ? free : waited;
}
