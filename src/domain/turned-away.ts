// Why a server turned a request away for a while (README "Sharing servers"): its choice, not a
// fault. The sample goes back to the queue with nothing charged and the endpoint backs off.
// One list: the /metrics counter's reasons and the error verdict's are derived from it.

export const TURNED_AWAY_REASONS = [
  /** 429 (a gateway's rate limit or load shedding), with or without Retry-After. */
  'rate_limited',
  /** 503 with X-SMG-Preempted: the SGLang model gateway shed a bulk request for others. */
  'preempted',
  /** 408 from a gateway: it gave up waiting for a slot. */
  'gateway_timeout',
] as const;
export type TurnedAwayReason = (typeof TURNED_AWAY_REASONS)[number];

/** The status reason of a run whose samples are only being turned away. */
export const BUSY_REASON = 'all endpoints are busy with other traffic';
