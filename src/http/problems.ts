import type { Context } from 'hono';
import type { ZodError } from 'zod';
import { readableIssues } from '../domain/issues.js';
import { fieldPath } from '../domain/text.js';
import { ApiError, openaiProblemBody, openaiStatus, problemBody } from '../errors.js';

/** A refused field, in the shape of a validation problem. */
export function fieldError(field: string, message: string): ApiError {
  return new ApiError('validation_failed', `${field}: ${message}`, { field, errors: [{ field, message }] });
}

/** A missing field says so ("required, a number"), where zod's own words are "expected number, received undefined". */
function messageOf(issue: ReturnType<typeof readableIssues>[number]): string {
  if (issue.code === 'invalid_type' && issue.message.endsWith('received undefined') && KINDS.has(issue.expected))
    return `required, ${article(issue.expected)} ${issue.expected}`;
  return issue.message;
}

/** The kinds a missing field is named by; any other (`nonoptional`, say) keeps zod's own words. */
const KINDS = new Set(['string', 'number', 'int', 'boolean', 'object', 'array', 'bigint']);

const article = (word: string) => (/^[aeiou]/.test(word) ? 'an' : 'a');

export function validationError(err: ZodError, where: string): ApiError {
  const errors = readableIssues(err.issues)
    .slice(0, 20)
    .map((i) => ({
      // A strict object refuses keys at its own path; name the first refused key, which is what users look for.
      field: fieldPath(i.code === 'unrecognized_keys' && i.keys.length ? [...i.path, i.keys[0]] : i.path) || where,
      message: messageOf(i),
    }));
  const first = errors[0];
  return new ApiError('validation_failed', first ? `${first.field}: ${first.message}` : `invalid ${where}`, {
    field: first?.field,
    errors,
  });
}

/** A problem+json answer; on the OpenAI layer (`openaiErrors`) with OpenAI's envelope and status beside it. */
export function problem(c: Context, err: ApiError): Response {
  const openai = c.get('errorShape') === 'openai';
  const body = openai ? openaiProblemBody(err, c.get('requestId')) : problemBody(err, c.get('requestId'));
  return c.newResponse(JSON.stringify(body), (openai ? openaiStatus(err) : err.status) as 400, { 'content-type': 'application/problem+json' });
}
