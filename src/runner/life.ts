/**
 * The runner's life, one state at a time. The moves (any other is a bug, and throws):
 *
 * | from                        | to         | when                                                          |
 * | --------------------------- | ---------- | ------------------------------------------------------------- |
 * | `idle`                      | `starting` | start(): the fleet joins (lock or replica row, recovery), the active runs are read |
 * | `starting`                  | `running`  | joined: the loop ticks, samples are claimed and sent          |
 * | `idle`, `starting`, `running` | `stopping` | stop(), a start that failed, or deposition by another process |
 * | `stopping`                  | `stopped`  | requests answered or given back, results committed, the fleet left |
 *
 * Only `running` claims, sends and wakes; a stop asked for while `starting` waits for the join to
 * end, then leaves, so no half-joined process is left behind.
 */
export type Life = 'idle' | 'starting' | 'running' | 'stopping' | 'stopped';

const MOVES: Record<Life, readonly Life[]> = {
  idle: ['starting', 'stopping'],
  starting: ['running', 'stopping'],
  running: ['stopping'],
  stopping: ['stopped'],
  stopped: [],
};

/** The state after the move from `from` to `to`; throws on a move the table does not allow. */
export function move(from: Life, to: Life): Life {
  if (!MOVES[from].includes(to)) throw new Error(`the runner cannot move from ${from} to ${to}`);
  return to;
}
