// When outputs and uploads are deleted (README "Expiry"): OpenAI's `expires_after` on files and
// `output_expires_after` on batches, and a run's `output.expires_after`. A deleted file or output
// keeps its row, marked expired, so that clients asking for it learn why it is gone.

/** OpenAI's bounds on `expires_after.seconds`: an hour to 30 days. */
export const MIN_EXPIRY_SECONDS = 3600;
export const MAX_EXPIRY_SECONDS = 30 * 24 * 3600;

/** Why `seconds` is no lifetime to take (below `min`, REGEN_MIN_EXPIRY_SECONDS in tests, or past 30 days), or null. */
export function expiryProblem(seconds: number, min: number): string | null {
  if (Number.isInteger(seconds) && seconds >= min && seconds <= MAX_EXPIRY_SECONDS) return null;
  return `must be a whole number of seconds from ${min} to ${MAX_EXPIRY_SECONDS} (30 days)`;
}

/** When a run's output expires: its lifetime from its finish (null while it runs, or when it has none). */
export function outputExpiresAt(r: { finishedAt: number | null; outputExpiresAfter: number | null }): number | null {
  return r.finishedAt === null || r.outputExpiresAfter === null ? null : r.finishedAt + r.outputExpiresAfter * 1000;
}
