import http from 'node:http';
import { APIConnectionError, APIConnectionTimeoutError, APIError, APIUserAbortError } from 'openai';
import https from 'node:https';
import type { AnswerLease } from './answer-budget.js';
import { EventStreamParser } from './sse.js';
import { readAnswerJson } from './request.js';
import { jsonTextNestsDeeperThan } from '../domain/json-depth.js';

/** The error a spec-compliant fetch rejects with on abort; the openai client recognises it by name. */
function abortError(): Error {
  return new DOMException('This operation was aborted', 'AbortError');
}

function headerRecord(h: HeadersInit | undefined): Record<string, string> {
  if (!h) return {};
  if (h instanceof Headers) return Object.fromEntries(h.entries());
  if (Array.isArray(h)) return Object.fromEntries(h);
  return h as Record<string, string>;
}

/** The read side of fetch's Headers, over a plain map: all the openai client asks of a response. */
class ResponseHeaders {
  private readonly map = new Map<string, string>();
  constructor(raw: string[]) {
    for (let i = 0; i + 1 < raw.length; i += 2) {
      const name = raw[i].toLowerCase();
      const prev = this.map.get(name);
      this.map.set(name, prev === undefined ? raw[i + 1] : `${prev}, ${raw[i + 1]}`);
    }
  }
  get(name: string): string | null {
    return this.map.get(name.toLowerCase()) ?? null;
  }
  has(name: string): boolean {
    return this.map.has(name.toLowerCase());
  }
  entries(): IterableIterator<[string, string]> {
    return this.map.entries();
  }
  [Symbol.iterator](): IterableIterator<[string, string]> {
    return this.map.entries();
  }
  forEach(fn: (value: string, name: string) => void): void {
    this.map.forEach(fn);
  }
}

/**
 * A fully read response. The fetch Response class would wrap the bytes in a web stream only for
 * the client to read them straight back; per request at thousands a second that shows in a profile.
 */
class BufferedResponse {
  readonly ok: boolean;
  readonly body = null;
  readonly bodyUsed = false;
  constructor(
    readonly status: number,
    readonly statusText: string,
    readonly headers: ResponseHeaders,
    readonly url: string,
    private readonly bytes: Buffer,
  ) {
    this.ok = status >= 200 && status < 300;
  }
  async text(): Promise<string> {
    return this.bytes.toString('utf8');
  }
  /** A 200 that is not JSON (HTML, a cut-off body) is the server's malformed answer, not a fault of regen's. */
  async json(): Promise<unknown> {
    return readAnswerJson(this.bytes.toString('utf8'), `the endpoint answered ${this.status} with a body that is not JSON`);
  }
  async arrayBuffer(): Promise<ArrayBuffer> {
    return new Uint8Array(this.bytes).buffer;
  }
}

/**
 * SGLang puts its error fields at the top level (`{"object":"error","message":...}`) while the
 * openai client only reads `{"error": {...}}`; without this the server's message would be lost.
 */
function errorBodyForClient(body: Buffer): string {
  const text = body.toString('utf8');
  let parsed: unknown;
  try {
    // Nested past any error's depth, it is only text: stringified again it would overflow the stack.
    parsed = jsonTextNestsDeeperThan(text) ? { message: text.slice(0, 1000) } : JSON.parse(text);
  } catch {
    parsed = { message: text.slice(0, 1000) };
  }
  return JSON.stringify(parsed && typeof parsed === 'object' && !('error' in parsed) ? { error: parsed } : parsed);
}

const NULL_BODY = new Set([101, 204, 205, 304]);

/** What requests.ts adds to the openai client's `fetchOptions`, which reach fetch as they are. */
export interface AnswerInit {
  /** The answer's share of the memory budget: its bytes are taken as they arrive, and a cut ends the request. */
  answerLease: AnswerLease;
}

/**
 * A fetch for the openai client built on node:http with a keep-alive agent per endpoint. The
 * global fetch (undici) spends several times more CPU per request on web-stream plumbing; with
 * thousands of requests a second that, not the GPUs, would set the pace.
 */
export function agentFetch(agent: http.Agent | https.Agent): typeof fetch {
  return ((input: string | URL | Request, init: RequestInit = {}) =>
    new Promise<Response>((resolve, reject) => {
      const url = new URL(typeof input === 'string' ? input : input instanceof URL ? input.href : input.url);
      const signal = init.signal ?? undefined;
      if (signal?.aborted) return reject(abortError());
      const body = init.body;
      if (body != null && typeof body !== 'string' && !(body instanceof Uint8Array)) {
        return reject(new TypeError('agentFetch sends string or byte bodies only'));
      }
      const lease = (init as Partial<AnswerInit>).answerLease;
      if (!lease) return reject(new TypeError('agentFetch reads answers under an answer lease only'));
      const mod = url.protocol === 'https:' ? https : http;
      let settled = false;
      const finish = (fn: () => void) => {
        if (settled) return;
        settled = true;
        signal?.removeEventListener('abort', onAbort);
        fn();
      };
      let req: http.ClientRequest;
      // A reused keep-alive socket that the server closed while idle fails before the server read
      // a byte of the request: that one is sent again, once, on a new connection.
      const send = (retried: boolean) => {
        let answered = false;
        req = mod.request(url, { method: init.method ?? 'GET', headers: headerRecord(init.headers), agent }, (res) => {
          answered = true;
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => {
            if (!settled && lease.take(c.length)) chunks.push(c);
          });
          res.on('error', (err) => finish(() => reject(signal?.aborted ? abortError() : Object.assign(new TypeError('fetch failed'), { cause: err }))));
          res.on('end', () =>
            finish(() => {
              const status = res.statusCode ?? 502;
              const raw = Buffer.concat(chunks);
              const payload = NULL_BODY.has(status) ? Buffer.alloc(0) : status >= 400 ? Buffer.from(errorBodyForClient(raw)) : raw;
              resolve(new BufferedResponse(status, res.statusMessage ?? '', new ResponseHeaders(res.rawHeaders), url.href, payload) as unknown as Response);
            }),
          );
        });
        const sent = req;
        req.on('error', (err) => {
          const code = (err as NodeJS.ErrnoException).code;
          if (!retried && !answered && !settled && !signal?.aborted && sent.reusedSocket && (code === 'ECONNRESET' || code === 'EPIPE')) return send(true);
          finish(() => reject(signal?.aborted ? abortError() : Object.assign(new TypeError('fetch failed'), { cause: err })));
        });
        req.end(body ?? undefined);
      };
      const onAbort = () => {
        req.destroy();
        finish(() => reject(abortError()));
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      lease.onCut((err) => {
        req.destroy();
        finish(() => reject(err));
      });
      send(false);
    })) as typeof fetch;
}

/**
 * How long an idle keep-alive socket is kept: under SGLang's own 5 s (SGLANG_TIMEOUT_KEEP_ALIVE),
 * so regen closes it before the server does and never reuses a socket the server is closing.
 */
export const IDLE_SOCKET_MS = 4000;

/**
 * Keep-alive with as many idle sockets kept as the endpoint can have requests in flight. The
 * agent's timeout closes a socket idle in its free list; on a request in flight it only emits an
 * event nobody acts on, so a long generation is not cut.
 */
export function endpointAgent(url: string): http.Agent | https.Agent {
  const opts = { keepAlive: true, maxSockets: Infinity, maxFreeSockets: 100_000, scheduling: 'lifo' as const, timeout: IDLE_SOCKET_MS };
  return url.startsWith('https:') ? new https.Agent(opts) : new http.Agent(opts);
}

/** What a streamed request is given. */
export interface StreamRequest {
  url: string;
  headers: Record<string, string>;
  body: string;
  signal: AbortSignal;
  timeoutMs: number;
  /** The answer's share of the memory budget: the unread part of the stream is held under it, and a cut ends the request. */
  lease: AnswerLease;
  /** Each event's data, in order; `data: [DONE]` ends the stream and is not passed on. */
  onData(data: string): void;
}

const DONE = '[DONE]';

/** A 200 answer given as one JSON body where a stream was asked for. */
export interface WholeAnswer {
  body: unknown;
}

/**
 * A POST whose 200 answer is read as server-sent events as they arrive, over the endpoint's
 * keep-alive agent. Parsed here rather than by the openai client's stream: that one wants a web
 * ReadableStream (Response.body) and decodes it line by line through async iterators, the very
 * plumbing agentFetch exists to avoid. Rejects with the openai client's own errors (APIError by
 * status, APIConnectionError, APIConnectionTimeoutError, APIUserAbortError) or, as agentFetch
 * does, AnswerRefused, so classifyError reads a streamed failure as it reads a buffered one.
 * Resolves once `[DONE]` has come, with undefined; or, when the server ignored `stream: true` and
 * answered one JSON body (an OpenAI-compatible server need not stream), with `{body}`, for the
 * caller to read as a buffered answer.
 */
export function streamPost(agent: http.Agent | https.Agent, r: StreamRequest): Promise<WholeAnswer | undefined> {
  return new Promise<WholeAnswer | undefined>((resolve, reject) => {
    if (r.signal.aborted) return reject(new APIUserAbortError());
    const url = new URL(r.url);
    const mod = url.protocol === 'https:' ? https : http;
    let settled = false;
    let req: http.ClientRequest;
    // A stream read to its end leaves its socket to the agent for the next request; any other end closes it.
    const finish = (fn: () => void, keepSocket = false) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      r.signal.removeEventListener('abort', onAbort);
      if (!keepSocket) req.destroy();
      fn();
    };
    const connectionError = (cause: Error) => finish(() => reject(new APIConnectionError({ cause })));
    // As in agentFetch: a reused keep-alive socket the server closed while idle fails before the
    // server read a byte of the request, and that request is sent again, once, on a new connection.
    const send = (retried: boolean) => {
      let answered = false;
      req = mod.request(url, { method: 'POST', headers: { ...r.headers, 'content-type': 'application/json', accept: 'text/event-stream' }, agent }, (res) => {
        answered = true;
        const status = res.statusCode ?? 502;
        res.setEncoding('utf8');
        const sse = /^text\/event-stream\b/i.test(res.headers['content-type'] ?? '');
        if (status !== 200 || !sse) {
          let text = '';
          // An error body is kept only in part, but all of it is taken: one without end is cut like an answer.
          const keep = status === 200 ? Number.POSITIVE_INFINITY : MAX_ERROR_BODY_CHARS;
          res.on('data', (c: string) => {
            if (!settled && r.lease.take(c.length) && text.length < keep) text += c;
          });
          res.on('end', () => {
            if (status !== 200) {
              // The headers go with the error: a Retry-After or a gateway's X-SMG-Preempted decides what it means.
              const headers = new Headers(Object.entries(res.headers).flatMap(([k, v]) => (v === undefined ? [] : [[k, String(v)] as [string, string]])));
              return finish(() => reject(APIError.generate(status, JSON.parse(errorBodyForClient(Buffer.from(text))), undefined, headers)), true);
            }
            let body: unknown;
            try {
              body = readAnswerJson(text, 'the endpoint answered 200 with neither server-sent events nor JSON');
            } catch (err) {
              return finish(() => reject(err), true);
            }
            finish(() => resolve({ body }), true);
          });
          res.on('error', connectionError);
          return;
        }
        const events = new EventStreamParser();
        res.on('data', (c: string) => {
          if (settled || !r.lease.take(c.length)) return;
          const held = events.heldChars;
          const completed = events.push(c);
          // Only the unfinished line and event stay held; what was read is let go.
          r.lease.give(held + c.length - events.heldChars);
          for (const data of completed) {
            if (settled) return;
            if (data === DONE) return finish(() => resolve(undefined), true);
            try {
              r.onData(data);
            } catch (err) {
              return finish(() => reject(err));
            }
          }
        });
        // A stream that stops before [DONE] lost its connection: what came is not a whole answer.
        res.on('end', () => connectionError(new Error('the stream ended before data: [DONE]')));
        res.on('error', connectionError);
      });
      const sent = req;
      req.on('error', (err) => {
        const code = (err as NodeJS.ErrnoException).code;
        if (!retried && !answered && !settled && !r.signal.aborted && sent.reusedSocket && (code === 'ECONNRESET' || code === 'EPIPE')) return send(true);
        connectionError(err);
      });
      req.end(r.body);
    };
    const onAbort = () => finish(() => reject(new APIUserAbortError()));
    r.signal.addEventListener('abort', onAbort, { once: true });
    r.lease.onCut((err) => finish(() => reject(err)));
    // The whole answer must come within the run's timeout, as with a buffered request.
    const timer = setTimeout(() => finish(() => reject(new APIConnectionTimeoutError())), r.timeoutMs);
    send(false);
  });
}

const MAX_ERROR_BODY_CHARS = 64 * 1024;
