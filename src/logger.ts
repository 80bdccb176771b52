import { pino, type Logger } from 'pino';

export type { Logger };

/**
 * A failed query's error (drizzle's) says `Failed query: <sql>\nparams: <values>`: the values are a
 * sample's text, a webhook's secret, an endpoint's key. The SQL stays, the values go, in the
 * message and in the stack that repeats it.
 */
const PARAMS_MARK = '\nparams: ';

function withoutQueryParams(err: unknown): unknown {
  if (typeof err !== 'object' || err === null) return err;
  const e = err as { name?: unknown; message?: unknown; stack?: unknown; code?: unknown; query?: unknown; params?: unknown; cause?: unknown };
  const message = typeof e.message === 'string' ? e.message : undefined;
  const cut = message?.indexOf(PARAMS_MARK) ?? -1;
  if (typeof e.query !== 'string' && cut < 0 && e.params === undefined) return err;
  // Rebuilt from the query where there is one; else everything after the mark goes (a value may
  // hold any text, the mark included).
  const safe =
    typeof e.query === 'string' ? `Failed query: ${e.query}${PARAMS_MARK}[redacted]` : cut >= 0 ? `${message!.slice(0, cut)}${PARAMS_MARK}[redacted]` : message;
  // The stack starts with the message it was made with: that exact text is swapped, nothing guessed.
  const stack = typeof e.stack === 'string' && message ? e.stack.split(message).join(safe) : undefined;
  // Rebuilt, not copied: the error's own fields include `params` itself.
  const cause = e.cause as { message?: unknown; code?: unknown } | string | undefined;
  return {
    name: e.name,
    message: safe,
    stack,
    code: e.code ?? (typeof cause === 'object' ? cause?.code : undefined),
    cause: typeof cause === 'string' ? cause : typeof cause?.message === 'string' ? cause.message : undefined,
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
