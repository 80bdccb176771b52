// SGLang's priority scheduling (managers/schedule_policy.py, scheduler.py; docs/sglang.md
// "Priority"), for the simulator's count-based ranks.

/** How a rank orders and preempts by priority: SGLang's launch flags. */
export interface PriorityPolicy {
  /** `--schedule-low-priority-values-first`: the smaller value goes first. */
  readonly lowFirst: boolean;
  /** `--default-priority-value`, given to a request without one; null: not given. */
  readonly defaultValue: number | null;
  /** `--priority-scheduling-preemption-threshold`. */
  readonly threshold: number;
  /** Off with `--disable-priority-preemption`. */
  readonly preemption: boolean;
}

/**
 * A request's standing: higher goes first, whichever way the server reads the scale. A request
 * without a priority, on a server without `--default-priority-value`, gets the far end of the
 * scale that goes last (-sys.maxsize - 1, or sys.maxsize when low values go first).
 */
export function standing(priority: number | null | undefined, policy: PriorityPolicy): number {
  const value = priority ?? policy.defaultValue;
  if (value === null) return Number.NEGATIVE_INFINITY;
  return policy.lowFirst ? -value : value;
}

/**
 * Whether a waiting request of standing `waiting` may push out a running one of standing
 * `running`: only by strictly more than the threshold. Two requests without a priority never
 * preempt each other (the difference of two infinities is NaN, never above the threshold).
 */
export function preempts(waiting: number, running: number, policy: PriorityPolicy): boolean {
  return policy.preemption && waiting - running > policy.threshold;
}
