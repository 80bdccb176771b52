import type { Context } from 'hono';
import type { ZodError } from 'zod';
import { ApiError, openaiProblemBody, openaiStatus, problemBody } from '../errors.js';

/** Turns a zod issue path into the dotted field name users see (`params.temperature`, `input.requests[3]`). */
function fieldName(path: PropertyKey[]): string {
  return path.reduce<string>((acc, p) => (typeof p === 'number' ? `${acc}[${p}]` : acc ? `${acc}.${String(p)}` : String(p)), '');
}

export function validationError(err: ZodError, where: string): ApiError {
  const errors = err.issues.slice(0, 20).map((i) => ({
    // A strict object refuses keys at its own path; name the first refused key, which is what users look for.
    field: fieldName(i.code === 'unrecognized_keys' && i.keys.length ? [...i.path, i.keys[0]] : i.path) || where,
    message: i.message,
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
