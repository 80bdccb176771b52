import { OpenAPIHono } from '@hono/zod-openapi';
import type { ZodError } from 'zod';
import type { Deps } from '../deps.js';
import { problem, validationError } from './problems.js';

export type AppEnv = { Variables: { deps: Deps; requestId: string } };
export type App = OpenAPIHono<AppEnv>;

/** An app that answers a request its route's schemas refuse with a validation problem; it knows no routes. */
export function createRouter(): App {
  return new OpenAPIHono<AppEnv>({
    defaultHook: (result, c) => {
      // Users send a body, not "json": the whole-body problems are named after what they sent.
      if (!result.success) return problem(c, validationError(result.error as ZodError, result.target === 'json' ? 'body' : result.target));
    },
  });
}
