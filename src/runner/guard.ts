import type { Logger } from '../logger.js';

/** Runs one step of the loop; its failure is logged, and the step is left to the next turn. */
export type Guard = <T>(what: string, step: () => T) => T | undefined;

/** Logs a step that failed, to be done again on a later turn. */
export function warnRetrying(logger: Logger, what: string, err: unknown): undefined {
  logger.warn({ err: { message: (err as Error).message, code: (err as { code?: unknown }).code } }, `${what} failed; retrying`);
  return undefined;
}

/**
 * The runner's guard: a step the database may refuse (SQLITE_BUSY once busy_timeout is spent,
 * while another process holds the write lock) is logged and done again on the next tick, instead
 * of an exception from a timer taking the whole process down.
 */
export function guardWith(logger: Logger): Guard {
  return <T>(what: string, step: () => T): T | undefined => {
    try {
      const result = step();
      // An async step's failure is caught the same way: the promise handed back never rejects.
      if (result instanceof Promise) return result.catch((err: unknown) => warnRetrying(logger, what, err)) as T;
      return result;
    } catch (err) {
      return warnRetrying(logger, what, err);
    }
  };
}
