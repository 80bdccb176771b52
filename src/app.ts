import type { Context } from 'hono';
import { bodyLimit } from 'hono/body-limit';
import { HTTPException } from 'hono/http-exception';
import { requestId } from 'hono/request-id';
import { ZodError } from 'zod';
import type { Deps } from './deps.js';
import { isDbBusy } from './db/client.js';
import { SecretKeyError } from './db/secrets.js';
import { ApiError } from './errors.js';
import { createRouter, openaiErrors, type App } from './http/app.js';
import { requireToken } from './http/auth.js';
import { allowedMethods } from './http/methods.js';
import { refuseBadText } from './http/text.js';
import { problem, validationError } from './http/problems.js';
import { OPENAI_PATHS, registerRoutes } from './routes/index.js';

export function createApp(deps: Deps): App {
  const app = createRouter();

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
  // Before the token check, so that its 401 is in OpenAI's shape there too.
  for (const path of OPENAI_PATHS) app.use(path, openaiErrors);
  app.use('/v1/*', requireToken(deps.config.apiTokens));
  app.use('/metrics', requireToken(deps.config.apiTokens));
  // Uploads stream and have no limit of their own; every other body is bounded.
  const streamsBody = (c: { req: { method: string; path: string } }) => c.req.method === 'POST' && c.req.path === '/v1/files';
  app.use('*', async (c, next) => {
    if (streamsBody(c)) return next();
    return bodyLimit({
      maxSize: deps.config.maxBodyBytes,
      onError: (c) => problem(c, new ApiError('payload_too_large', `request body is larger than ${deps.config.maxBodyBytes} bytes`)),
    })(c, next);
  });

  app.use('*', refuseBadText(streamsBody));

  const methodsOn = allowedMethods(app);
  const notAllowed = (c: Context, allowed: string[]) => {
    c.header('Allow', allowed.join(', '));
    return problem(c, new ApiError('method_not_allowed', `${c.req.method} is not allowed on ${c.req.path.slice(0, 200)}; use ${allowed.join(', ')}`));
  };
  // A path a route names literally (`POST /v1/runs/validate`) is that route's, though a
  // parameterised one (`GET /v1/runs/{id}`) would match it too: another method there is a 405.
  app.use('*', async (c, next) => {
    const literal = methodsOn(c.req.path, true);
    if (literal.length && !literal.includes(c.req.method)) return notAllowed(c, literal);
    await next();
  });

  registerRoutes(app);

  app.notFound((c) => {
    const allowed = methodsOn(c.req.path);
    if (allowed.length && !allowed.includes(c.req.method)) return notAllowed(c, allowed);
    return problem(c, new ApiError('not_found', `no route for ${c.req.method} ${c.req.path.slice(0, 200)}`));
  });
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
    if (err instanceof SecretKeyError) {
      // This process is closing (server.ts): the replicas holding the key answer.
      return problem(
        c,
        new ApiError('storage_unavailable', 'this server cannot open the stored secrets with its REGEN_SECRET_KEY and is stopping; try another replica'),
      );
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
