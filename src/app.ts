import { OpenAPIHono } from '@hono/zod-openapi';
import { bodyLimit } from 'hono/body-limit';
import { HTTPException } from 'hono/http-exception';
import { requestId } from 'hono/request-id';
import { createHash, timingSafeEqual } from 'node:crypto';
import type { Context, MiddlewareHandler } from 'hono';
import { ZodError } from 'zod';
import type { AppEnv, Deps } from './deps.js';
import { isDbBusy } from './db/client.js';
import { ApiError, problemBody } from './errors.js';
import { registerRoutes } from './routes/index.js';

export type App = OpenAPIHono<AppEnv>;

/** Turns a zod issue path into the dotted field name users see (`params.temperature`, `input.requests[3]`). */
export function fieldName(path: PropertyKey[]): string {
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

export function problem(c: Context, err: ApiError): Response {
  const body = problemBody(err, c.get('requestId'));
  return c.newResponse(JSON.stringify(body), err.status as 400, { 'content-type': 'application/problem+json' });
}

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

export function createApp(deps: Deps): App {
  const app = new OpenAPIHono<AppEnv>({
    defaultHook: (result, c) => {
      // Users send a body, not "json": the whole-body problems are named after what they sent.
      if (!result.success) return problem(c, validationError(result.error as ZodError, result.target === 'json' ? 'body' : result.target));
    },
  });

  app.use('*', requestId());
  app.use('*', async (c, next) => {
    c.set('deps', deps);
    const started = performance.now();
    await next();
    deps.logger.debug(
      { req_id: c.get('requestId'), method: c.req.method, path: c.req.path, status: c.res.status, ms: Math.round(performance.now() - started) },
      'request',
    );
  });
  app.use('/v1/*', requireToken(deps.config.apiTokens));
  app.use('/metrics', requireToken(deps.config.apiTokens));
  // Uploads stream and have no limit of their own; every other body is bounded.
  app.use('*', async (c, next) => {
    if (c.req.method === 'POST' && c.req.path === '/v1/files') return next();
    return bodyLimit({
      maxSize: deps.config.maxBodyBytes,
      onError: (c) => problem(c, new ApiError('payload_too_large', `request body is larger than ${deps.config.maxBodyBytes} bytes`)),
    })(c, next);
  });

  registerRoutes(app);

  app.notFound((c) => problem(c, new ApiError('not_found', `no route for ${c.req.method} ${c.req.path.slice(0, 200)}`)));
  app.onError((err, c) => {
    if (err instanceof ApiError) return problem(c, err);
    if (err instanceof ZodError) return problem(c, validationError(err, 'body'));
    if (err instanceof HTTPException) {
      // Hono raises these for bodies it cannot parse (malformed JSON and the like).
      const status = err.status;
      if (status === 413) return problem(c, new ApiError('payload_too_large', 'request body is too large'));
      if (status === 415) return problem(c, new ApiError('unsupported_media_type', 'send the request body as application/json'));
      return problem(c, new ApiError('invalid_request', status === 400 ? 'request body is not valid JSON' : err.message));
    }
    if (isDbBusy(err)) {
      deps.logger.warn({ req_id: c.get('requestId'), err: { message: err.message } }, 'database busy; request refused');
      return problem(c, new ApiError('storage_unavailable', 'the database is busy; try again'));
    }
    deps.logger.error({ req_id: c.get('requestId'), err: { name: err.name, message: err.message, stack: err.stack } }, 'unhandled error');
    return problem(c, new ApiError('internal_error', 'internal error; see the server log for this request id'));
  });
  return app;
}
