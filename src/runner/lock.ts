/**
 * Another live regen process holds the runner lock of this database: two dispatchers would send
 * samples twice. Its own module, so the API thread can recognise it without loading the runner.
 */
export class RunnerLockedError extends Error {}
