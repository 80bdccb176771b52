import { createHash, timingSafeEqual } from 'node:crypto';
import type { MiddlewareHandler } from 'hono';
import { ApiError } from '../errors.js';
import type { AppEnv } from './app.js';
import { problem } from './problems.js';

function digest(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}

/** Bearer-token check in constant time; a no-op when no tokens are configured. */
export function requireToken(tokens: string[]): MiddlewareHandler<AppEnv> {
  const digests = tokens.map(digest);
  return async (c, next) => {
    if (digests.length === 0) return next();
    const m = /^Bearer\s+(.+)$/i.exec(c.req.header('authorization') ?? '');
    const given = digest(m?.[1]?.trim() ?? '');
    let ok = false;
    for (const d of digests) ok = timingSafeEqual(d, given) || ok;
    if (!ok) return problem(c, new ApiError('unauthorized', 'a valid "Authorization: Bearer <token>" header is required'));
    return next();
  };
}
