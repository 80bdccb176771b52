import type { z } from 'zod';

type Issue = z.core.$ZodIssue;

/** Codes by which a union's branch says the value is not of its kind at all (another type, keys it does not have, another literal). */
const NOT_THIS_BRANCH = new Set<Issue['code']>(['invalid_type', 'unrecognized_keys', 'invalid_value']);

/**
 * A schema's issues as a user reads them: a union that one branch alone fits (`{requests: [...]}`
 * among file_id, uri and requests; an array of `stop` strings) reports that branch's own issues
 * (too many requests, too many stop strings) at their full path, rather than "matches none".
 */
export function readableIssues(issues: readonly Issue[]): Issue[] {
  return issues.flatMap((issue) => {
    if (issue.code !== 'invalid_union') return [issue];
    const fitting = issue.errors.filter((branch) => !branch.some((i) => i.path.length === 0 && NOT_THIS_BRANCH.has(i.code)));
    if (fitting.length !== 1) return [issue];
    return readableIssues(fitting[0].map((i) => ({ ...i, path: [...issue.path, ...i.path] }) as Issue));
  });
}
