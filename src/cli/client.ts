// The HTTP side of the `regen` client commands: base URL and token from flags and env, every call
// through the typed client (src/client), and every failure turned into one line a user can act on.
import type { ClientPathsWithMethod, MaybeOptionalInit, MethodResponse } from 'openapi-fetch';
import { createRegenClient, RegenApiError, unwrap, type paths, type RegenClient } from '../client/index.js';

export const DEFAULT_SERVER = 'http://127.0.0.1:8080';

/** A mistake in how the command was called: exit code 2. */
export class UsageError extends Error {}

/** The server refused or failed a request (status 0: it could not be reached); the message is the problem's detail. */
export { RegenApiError as ApiCallError };

export interface ClientOptions {
  server?: string;
}

// openapi-fetch's own rule for its last argument (not exported by it): optional unless the
// operation has a required parameter or body.
type RequiredKeys<T> = { [K in keyof T]-?: Record<never, never> extends Pick<T, K> ? never : K }[keyof T];
type InitParam<I> = RequiredKeys<I> extends never ? [(I & { [key: string]: unknown })?] : [I & { [key: string]: unknown }];

type Method = 'get' | 'post' | 'patch' | 'delete';
/** An openapi-fetch method that resolves to the 2xx body and throws ApiCallError otherwise. */
type Call<M extends Method> = <P extends ClientPathsWithMethod<RegenClient, M>, I extends MaybeOptionalInit<paths[P], M>>(
  path: P,
  ...init: InitParam<I>
) => Promise<MethodResponse<RegenClient, M, P, I>>;

export class Client {
  readonly base: string;
  /** The typed client itself, for a call that needs its whole answer (the events stream). */
  readonly api: RegenClient;

  constructor(opts: ClientOptions, env: NodeJS.ProcessEnv = process.env) {
    const raw = opts.server ?? env.REGEN_URL ?? DEFAULT_SERVER;
    let url: URL;
    try {
      url = new URL(raw);
    } catch {
      throw new UsageError(`--server: expected an http:// or https:// URL (got ${JSON.stringify(raw)})`);
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:')
      throw new UsageError(`--server: expected an http:// or https:// URL (got ${JSON.stringify(raw)})`);
    this.base = url.toString().replace(/\/+$/, '');
    this.api = createRegenClient({ baseUrl: this.base, token: env.REGEN_TOKEN?.trim() || undefined, fetch: (request) => this.reach(request) });
  }

  /** fetch, with a connection failure made into one clear line. */
  private async reach(request: Request): Promise<Response> {
    try {
      return await fetch(request);
    } catch (err) {
      if ((err as Error).name === 'AbortError') throw err;
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      throw new RegenApiError(
        0,
        undefined,
        `cannot reach ${this.base} (${cause?.code ?? cause?.message ?? (err as Error).message}); is \`regen serve\` running? (--server / REGEN_URL)`,
      );
    }
  }

  // The wrappers only pass their arguments on; the cast is there because TypeScript cannot match
  // openapi-fetch's conditional argument type to the same type spelled again above.
  readonly get = ((path: string, init?: object) => unwrap(this.api.GET(path as never, init as never))) as Call<'get'>;
  readonly post = ((path: string, init?: object) => unwrap(this.api.POST(path as never, init as never))) as Call<'post'>;
  readonly patch = ((path: string, init?: object) => unwrap(this.api.PATCH(path as never, init as never))) as Call<'patch'>;
  readonly delete = ((path: string, init?: object) => unwrap(this.api.DELETE(path as never, init as never))) as Call<'delete'>;

  /** POST /v1/files with the JSONL as the raw body; a stream is sent as it is read, never held whole. */
  upload(filename: string, body: string | ReadableStream<Uint8Array>) {
    return this.post('/v1/files', {
      params: { query: { filename } },
      // The document types a binary body as a string. The serializer passes the text or the stream
      // through instead of making it JSON, and `duplex: 'half'` lets fetch send a stream.
      body: body as string,
      bodySerializer: (raw: unknown) => raw,
      headers: { 'content-type': 'application/jsonl' },
      duplex: 'half',
    });
  }
}
