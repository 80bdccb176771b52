import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createRun } from './runner-checks.js';

// A server that passes regen's probes (/health, /v1/models) and answers every chat completion
// with HTTP 200 and a body that is not a proper answer, buffered or streamed as the request asks.

export type AnswerFault =
  /** Text without end: a JSON body that never closes, or events that never reach `[DONE]`. */
  | 'endless'
  /** An HTML page. */
  | 'html'
  /** JSON cut off mid-answer, in a well-framed body. */
  | 'cut-json'
  /** A proper answer whose usage is absurd (negative prompt tokens, 1e308 completion tokens). */
  | 'bad-usage'
  /**
   * A proper answer; streamed, framed as a proxy may frame it: CRLF line ends, comments, a field
   * without a colon, `data:` without its space, an event's JSON split over two `data` lines.
   */
  | 'crlf'
  /**
   * A proper answer whose usage breaks its own sums: more cached tokens than prompt tokens, more
   * reasoning tokens (OpenAI's `completion_tokens_details`) than completion tokens.
   */
  | 'impossible-usage'
  /** A proper answer whose content and reasoning hold unpaired surrogates (LONE_CONTENT, LONE_REASONING). */
  | 'lone-surrogates'
  /** A proper answer with a field nested DEEP_LEVELS deep (its logprobs; an event's field when streamed). */
  | 'deep'
  /** A proper answer. */
  | 'none';

const BAD_USAGE = { prompt_tokens: -5, completion_tokens: 1e308, total_tokens: 1e308, reasoning_tokens: 0 };
export const IMPOSSIBLE_USAGE = {
  prompt_tokens: 10,
  completion_tokens: 3,
  total_tokens: 13,
  prompt_tokens_details: { cached_tokens: 5000 },
  completion_tokens_details: { reasoning_tokens: 9 },
};
/** Text with a high surrogate alone, and one with a low surrogate alone, as JSON's `\\uXXXX` escapes carry them. */
export const LONE_CONTENT = 'an \ud800 answer';
export const LONE_REASONING = 'some \udc00 thought';
export const GOOD_USAGE = { prompt_tokens: 12, completion_tokens: 3, total_tokens: 15, reasoning_tokens: 0 };

const WORDS = 'alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango'.split(' ');

/** Varied words (a period far past the loop watch's 500 characters), so a stream of them is not cut as a loop. */
function words(count: number): string {
  let x = 12345;
  const out: string[] = [];
  for (let i = 0; i < count; i++) {
    x = (x * 1103515245 + 12345) % 2 ** 31;
    out.push(WORDS[x % WORDS.length]);
  }
  return out.join(' ');
}

const CHUNK_WORDS = 8000;
const EVENT_WORDS = 30;

function chunkEvent(content: string | null, extra: Record<string, unknown> = {}): string {
  const choices = content === null ? [] : [{ index: 0, delta: { content }, finish_reason: null }];
  return `data: ${JSON.stringify({ id: 'broken', object: 'chat.completion.chunk', created: 1, model: 'broken-model', choices, ...extra })}\n\n`;
}

export const DEEP_LEVELS = 100_000;
const DEEP = `${'['.repeat(DEEP_LEVELS)}${']'.repeat(DEEP_LEVELS)}`;

/** An event's lines ended in CRLF. */
const crlf = (event: string) => event.replace(/\n/g, '\r\n');

/** An event's JSON cut in two after its first field, to be sent as two `data` lines. */
function splitJson(event: string): [string, string] {
  const body = event.slice('data: '.length).trimEnd();
  const cut = body.indexOf(',') + 1;
  return [body.slice(0, cut), body.slice(cut)];
}

/** The endless bodies, built once: each block is written again and again. */
const ENDLESS_JSON_HEAD = '{"id":"broken","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"';
const ENDLESS_JSON_BLOCK = Buffer.from(`${words(CHUNK_WORDS)} `);
const ENDLESS_SSE_BLOCK = Buffer.from(sseBlock());

function sseBlock(): string {
  const all = words(CHUNK_WORDS).split(' ');
  const events: string[] = [];
  for (let i = 0; i < all.length; i += EVENT_WORDS) events.push(chunkEvent(`${all.slice(i, i + EVENT_WORDS).join(' ')} `));
  return events.join('');
}

function answer(usage: object, content = 'The answer.', reasoning: string | null = null): object {
  return {
    id: 'broken',
    object: 'chat.completion',
    created: 1,
    model: 'broken-model',
    choices: [{ index: 0, message: { role: 'assistant', content, reasoning_content: reasoning }, finish_reason: 'stop' }],
    usage,
  };
}

/** Writes `block` for as long as the client reads, at the pace it reads. */
function endless(res: ServerResponse, block: Buffer): void {
  const pump = () => {
    while (!res.destroyed && res.write(block));
    if (!res.destroyed) res.once('drain', pump);
  };
  pump();
}

export interface BrokenServer {
  url: string;
  fault: AnswerFault;
  /** Chat completions asked so far, and how many of them streamed. */
  completions: number;
  streamed: number;
  close(): Promise<void>;
}

/**
 * `holdUntil`: endless answers start only once that many chat requests have arrived, so that all
 * of them are in flight at once however slowly regen dispatches.
 */
export async function startBrokenServer(opts: { fault: AnswerFault; contextLength: number; holdUntil?: number }): Promise<BrokenServer> {
  const state = { fault: opts.fault, completions: 0, streamed: 0 };
  let held: (() => void)[] = [];
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const json = (status: number, body: unknown, type = 'application/json') => {
      res.writeHead(status, { 'content-type': type });
      res.end(typeof body === 'string' ? body : JSON.stringify(body));
    };
    if (req.url === '/health') return void req.resume().on('end', () => json(200, {}));
    if (req.url === '/v1/models') {
      return void req
        .resume()
        .on('end', () => json(200, { object: 'list', data: [{ id: 'broken-model', object: 'model', max_model_len: opts.contextLength }] }));
    }
    if (req.url !== '/v1/chat/completions') return void req.resume().on('end', () => json(404, { object: 'error', message: 'not found' }));
    let raw = '';
    req.setEncoding('utf8');
    req.on('data', (c: string) => (raw += c));
    req.on('end', () => {
      const stream = (JSON.parse(raw) as { stream?: boolean }).stream === true;
      state.completions++;
      if (stream) state.streamed++;
      const sse = () => res.writeHead(200, { 'content-type': 'text/event-stream' });
      switch (state.fault) {
        case 'endless': {
          const start = () => {
            if (stream) {
              sse();
              return endless(res, ENDLESS_SSE_BLOCK);
            }
            res.writeHead(200, { 'content-type': 'application/json' });
            res.write(ENDLESS_JSON_HEAD);
            endless(res, ENDLESS_JSON_BLOCK);
          };
          held.push(start);
          if (state.completions < (opts.holdUntil ?? 0)) return;
          for (const go of held) go();
          held = [];
          return;
        }
        case 'html':
          return json(200, '<!doctype html><html><body><h1>502 Bad Gateway</h1></body></html>', 'text/html');
        case 'cut-json':
          return json(200, JSON.stringify(answer(GOOD_USAGE)).slice(0, 60));
        case 'crlf': {
          if (!stream) return json(200, answer(GOOD_USAGE));
          sse();
          res.write(': keep-alive\r\n\r\n');
          const [head, rest] = splitJson(chunkEvent('The answer.'));
          res.write(`data: ${head}\r\ndata:${rest}\r\nretry\r\n\r\n`);
          res.write(crlf(chunkEvent(null, { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })));
          res.write(crlf(chunkEvent(null, { usage: GOOD_USAGE })));
          return res.end('data: [DONE]\r\n\r\n');
        }
        case 'deep': {
          if (!stream) {
            const body = JSON.stringify({ ...answer(GOOD_USAGE), choices: [{ index: 0, message: { content: 'hi' }, finish_reason: 'stop', logprobs: 0 }] });
            return json(200, body.replace('"logprobs":0', `"logprobs":${DEEP}`));
          }
          sse();
          res.write(chunkEvent('The answer.').replace('"model"', `"deep":${DEEP},"model"`));
          res.write(chunkEvent(null, { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }));
          res.write(chunkEvent(null, { usage: GOOD_USAGE }));
          return res.end('data: [DONE]\n\n');
        }
        case 'lone-surrogates':
          if (!stream) return json(200, answer(GOOD_USAGE, LONE_CONTENT, LONE_REASONING));
          sse();
          res.write(chunkEvent(null, { choices: [{ index: 0, delta: { reasoning_content: LONE_REASONING }, finish_reason: null }] }));
          res.write(chunkEvent(LONE_CONTENT));
          res.write(chunkEvent(null, { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }));
          res.write(chunkEvent(null, { usage: GOOD_USAGE }));
          return res.end('data: [DONE]\n\n');
        case 'bad-usage':
        case 'impossible-usage':
        case 'none': {
          const usage = state.fault === 'bad-usage' ? BAD_USAGE : state.fault === 'impossible-usage' ? IMPOSSIBLE_USAGE : GOOD_USAGE;
          if (!stream) return json(200, answer(usage));
          sse();
          res.write(chunkEvent('The answer.'));
          res.write(chunkEvent(null, { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }));
          res.write(chunkEvent(null, { usage }));
          return res.end('data: [DONE]\n\n');
        }
      }
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    get fault() {
      return state.fault;
    },
    set fault(f: AnswerFault) {
      state.fault = f;
    },
    get completions() {
      return state.completions;
    },
    get streamed() {
      return state.streamed;
    },
    async close() {
      const closed = once(server, 'close');
      server.close();
      server.closeAllConnections();
      await closed;
    },
  };
}

/** The model the broken servers serve. */
export const BROKEN_MODEL = 'broken-model';

/** `n` inline requests whose custom ids start with `tag`. */
export function brokenRequests(n: number, tag: string) {
  return Array.from({ length: n }, (_, i) => ({ custom_id: `${tag}${i}`, messages: [{ role: 'user', content: `question ${i}` }] }));
}

/** Two runs on one endpoint: one read buffered (quality checks off), one streamed (loops stopped). */
export async function bufferedAndStreamed(base: string, perRun: number): Promise<{ buffered: string; streamed: string }> {
  const buffered = await createRun(base, { model: BROKEN_MODEL, input: { requests: brokenRequests(perRun, 'b') }, quality: false });
  const streamed = await createRun(base, { model: BROKEN_MODEL, input: { requests: brokenRequests(perRun, 's') }, quality: { stop_loops: true } });
  return { buffered: buffered.id, streamed: streamed.id };
}
