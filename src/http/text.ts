import type { MiddlewareHandler } from 'hono';
import { fieldPath, findBadText, mayHoldBadText, textProblem } from '../domain/text.js';
import type { AppEnv } from './app.js';
import { fieldError, problem } from './problems.js';

const JSON_MEDIA_TYPE = /^application\/(?:[\w.-]+\+)?json$/;

/**
 * Refuses, before any route sees it, a query parameter or a JSON body holding a string no store or
 * reader downstream can take (`domain/text.ts`), naming the field: every field of every route is
 * covered, the ones added later too. The body read here is the one the route's validator parses.
 */
export function refuseBadText(streamsBody: (c: { req: { method: string; path: string } }) => boolean): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    for (const [name, value] of new URL(c.req.url).searchParams) {
      const badName = textProblem(name);
      if (badName) return problem(c, fieldError('query', `a parameter name ${badName}`));
      const badValue = textProblem(value);
      if (badValue) return problem(c, fieldError(name, badValue));
    }
    const mediaType = (c.req.header('content-type') ?? '').split(';')[0].trim().toLowerCase();
    if (!c.req.raw.body || streamsBody(c) || !JSON_MEDIA_TYPE.test(mediaType)) return next();
    let text: string;
    try {
      text = await c.req.text();
    } catch {
      // Too large or cut off: the route's own reading of the body says so.
      return next();
    }
    if (!mayHoldBadText(text)) return next();
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      return next();
    }
    const found = findBadText(body);
    return found ? problem(c, fieldError(fieldPath(found.path) || 'body', found.message)) : next();
  };
}
