import { OpenAPIHono } from '@hono/zod-openapi';
import type { MiddlewareHandler } from 'hono';
import type { ZodError } from 'zod';
import type { Deps } from '../deps.js';
import { problem, validationError } from './problems.js';

/** `errorShape` is set on the OpenAI layer's requests (`openaiErrors`). */
export type AppEnv = { Variables: { deps: Deps; requestId: string; errorShape?: 'openai' } };
export type App = OpenAPIHono<AppEnv>;

/** An app that answers a request its route's schemas refuse with a validation problem (`problem` picks its shape); it knows no routes. */
export function createRouter(): App {
  return new OpenAPIHono<AppEnv>({
    defaultHook: (result, c) => {
      // Users send a body, not "json": the whole-body problems are named after what they sent.
      if (!result.success) return problem(c, validationError(result.error as ZodError, result.target === 'json' ? 'body' : result.target));
    },
  });
}

/**
 * Marks the requests under it as the OpenAI layer's: their errors, from the token check on, carry
 * OpenAI's envelope and status codes. The content type stays problem+json; OpenAI's SDKs read the
 * body whatever its type.
 */
export const openaiErrors: MiddlewareHandler<AppEnv> = (c, next) => {
  c.set('errorShape', 'openai');
  return next();
};
