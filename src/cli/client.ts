// The HTTP side of the `regen` client commands: base URL and token from flags and env, JSON in and
// out, and every failure turned into one line a user can act on.

export const DEFAULT_SERVER = 'http://127.0.0.1:8080';

/** A mistake in how the command was called: exit code 2. */
export class UsageError extends Error {}

/** The server refused or failed a request; `detail` is the problem+json detail. */
export class ApiCallError extends Error {
  constructor(
    readonly status: number,
    readonly code: string | undefined,
    detail: string,
  ) {
    super(detail);
  }
}

export interface ClientOptions {
  server?: string;
}

export class Client {
  readonly base: string;
  private readonly token: string | undefined;

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
    this.token = env.REGEN_TOKEN?.trim() || undefined;
  }

  /** fetch against the server with the bearer token; connection failures become one clear line. */
  async fetch(path: string, init: RequestInit & { duplex?: 'half' } = {}): Promise<Response> {
    const headers = new Headers(init.headers);
    if (this.token) headers.set('authorization', `Bearer ${this.token}`);
    try {
      return await fetch(this.base + path, { ...init, headers });
    } catch (err) {
      if ((err as Error).name === 'AbortError') throw err;
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      throw new ApiCallError(
        0,
        'unreachable',
        `cannot reach ${this.base} (${cause?.code ?? cause?.message ?? (err as Error).message}); is \`regen serve\` running? (--server / REGEN_URL)`,
      );
    }
  }

  async request<T>(method: string, path: string, opts: { json?: unknown; headers?: Record<string, string> } = {}): Promise<T> {
    const res = await this.fetch(path, {
      method,
      headers: { ...(opts.json !== undefined ? { 'content-type': 'application/json' } : {}), ...opts.headers },
      ...(opts.json !== undefined ? { body: JSON.stringify(opts.json) } : {}),
    });
    return readJson<T>(res);
  }

  get<T>(path: string): Promise<T> {
    return this.request<T>('GET', path);
  }

  post<T>(path: string, json: unknown = {}, headers?: Record<string, string>): Promise<T> {
    return this.request<T>('POST', path, { json, headers });
  }
}

export async function readJson<T>(res: Response): Promise<T> {
  const text = await res.text();
  let body: { detail?: string; code?: string } | undefined;
  try {
    body = text ? JSON.parse(text) : undefined;
  } catch {
    body = undefined;
  }
  if (!res.ok) {
    const hint = res.status === 401 ? ' (set REGEN_TOKEN)' : '';
    throw new ApiCallError(res.status, body?.code, `${body?.detail ?? `the server answered ${res.status} ${res.statusText}`}${hint}`);
  }
  return body as T;
}

export const enc = encodeURIComponent;
