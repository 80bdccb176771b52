import { pino, type Logger } from 'pino';

export type { Logger };

/** JSON lines on stdout; secrets are redacted wherever they might appear in a logged object. */
export function makeLogger(level: string, destination?: pino.DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: 'regen' },
      redact: {
        paths: ['authorization', 'headers.authorization', 'req.headers.authorization', 'api_key', 'apiKey', '*.api_key', '*.apiKey', 'token', '*.token'],
        censor: '[redacted]',
      },
    },
    destination,
  );
}
