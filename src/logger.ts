import { pino, type Logger } from 'pino';

export type { Logger };

/**
 * A failed query's error (drizzle's) says `Failed query: <sql>\nparams: <values>`: the values are a
 * sample's text, a webhook's secret, an endpoint's key. The SQL stays, the values go, in the
 * message and in the stack that repeats it (up to its first frame).
 */
const QUERY_PARAMS = /\nparams: [\s\S]*?(?=\n {4}at |$)/;

function withoutQueryParams(err: unknown): unknown {
  if (typeof err !== 'object' || err === null) return err;
  const e = err as { name?: unknown; message?: unknown; stack?: unknown; code?: unknown; params?: unknown; cause?: unknown };
  const carries = (v: unknown) => typeof v === 'string' && QUERY_PARAMS.test(v);
  if (!carries(e.message) && !carries(e.stack) && e.params === undefined) return err;
  const scrub = (v: unknown) => (typeof v === 'string' ? v.replace(QUERY_PARAMS, '\nparams: [redacted]') : v);
  // Rebuilt, not copied: the error's own fields include `params` itself.
  const cause = e.cause as { message?: unknown; code?: unknown } | undefined;
  return {
    name: e.name,
    message: scrub(e.message),
    stack: scrub(e.stack),
    code: e.code ?? cause?.code,
    cause: typeof cause?.message === 'string' ? cause.message : undefined,
  };
}

/** JSON lines on stdout; secrets are redacted wherever they might appear in a logged object. */
export function makeLogger(level: string, destination?: pino.DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: 'regen' },
      formatters: {
        log: (object) => ('err' in object ? { ...object, err: withoutQueryParams(object.err) } : object),
      },
      redact: {
        paths: ['authorization', 'headers.authorization', 'req.headers.authorization', 'api_key', 'apiKey', '*.api_key', '*.apiKey', 'token', '*.token'],
        censor: '[redacted]',
      },
    },
    destination,
  );
}
