import type { RunEndpoint } from './run-endpoint.js';

// The request of a completions or embeddings run's line: a raw prompt (no chat template), or an
// input to embed. Each is one text or one sequence of token ids, so a line is one sample and one
// output line; several prompts go on several lines.

export type TokenIds = number[];
export type RawRequest = { prompt: string | TokenIds } | { input: string | TokenIds };

/** The field that carries a line's request on each raw endpoint. */
const FIELD = { '/v1/completions': 'prompt', '/v1/embeddings': 'input' } as const;

/** OpenAI's bound on a completion's `logprobs` (the alternatives per token), which SGLang keeps too. */
const MAX_COMPLETION_LOGPROBS = 20;
const MAX_DIMENSIONS = 65_536;

type Read = { raw: RawRequest; rest: Record<string, unknown> } | { error: string };

/**
 * A raw line's prompt or input, read from `source` (the line itself, or an OpenAI batch line's
 * `body`, `at` "body."), and the source's other fields (`rest`: a batch body's params and model).
 */
export function rawRequestOf(endpoint: Exclude<RunEndpoint, '/v1/chat/completions'>, source: Record<string, unknown>, at: string): Read {
  const field = FIELD[endpoint];
  const { [field]: value, ...rest } = source;
  if (value === undefined) {
    const chat = source.messages !== undefined ? `: a ${endpoint} request has no messages` : '';
    return { error: `no ${at}${field}: a ${endpoint} request's ${field} is a text or an array of token ids${chat}` };
  }
  const problem = textOrTokens(value, `${at}${field}`) ?? paramsProblem(endpoint, at === '' ? (source.params ?? {}) : rest, at === '' ? 'params.' : at);
  if (problem) return { error: problem };
  const raw = (field === 'prompt' ? { prompt: value } : { input: value }) as RawRequest;
  return { raw, rest };
}

function textOrTokens(value: unknown, path: string): string | null {
  if (typeof value === 'string') return value.trim() === '' ? `${path} must not be empty` : null;
  if (!Array.isArray(value) || value.length === 0) return `${path} must be a non-empty string or a non-empty array of token ids`;
  if (typeof value[0] !== 'number') return `${path}: one ${path.slice(path.lastIndexOf('.') + 1)} a line (text or token ids); put each on its own line`;
  const bad = value.findIndex((t) => !Number.isInteger(t) || (t as number) < 0);
  return bad === -1 ? null : `${path}[${bad}] must be a token id (a whole number from 0)`;
}

/** The raw endpoints' own params, checked where SGLang would take a wrong one silently or fail the whole request. */
export function paramsProblem(endpoint: RunEndpoint, params: unknown, at: string): string | null {
  if (typeof params !== 'object' || params === null) return null;
  const p = params as Record<string, unknown>;
  if (endpoint === '/v1/completions') {
    if (p.echo !== undefined && typeof p.echo !== 'boolean') return `${at}echo must be true or false`;
    const lp = p.logprobs;
    if (lp !== undefined && lp !== null && !(Number.isInteger(lp) && (lp as number) >= 0 && (lp as number) <= MAX_COMPLETION_LOGPROBS))
      return `${at}logprobs must be a whole number from 0 to ${MAX_COMPLETION_LOGPROBS} (a completion's alternatives per token)`;
    return null;
  }
  if (p.encoding_format !== undefined && p.encoding_format !== 'float' && p.encoding_format !== 'base64')
    return `${at}encoding_format must be "float" or "base64"`;
  const d = p.dimensions;
  if (d !== undefined && !(Number.isInteger(d) && (d as number) >= 1 && (d as number) <= MAX_DIMENSIONS))
    return `${at}dimensions must be a whole number from 1 to ${MAX_DIMENSIONS}`;
  if (p.n !== undefined && p.n !== 1) return `${at}n: an embedding has one answer`;
  return null;
}

/** The request of a stored sample (its request JSON parsed) as its kind: chat messages, a raw prompt, or an input. */
export function isRaw(request: object): request is RawRequest {
  return 'prompt' in request || 'input' in request;
}

/** The body for a raw prompt (`/v1/completions`) or an input to embed (`/v1/embeddings`). */
export function rawBody(request: RawRequest, params: Record<string, unknown>, n: number | undefined, model: string): Record<string, unknown> {
  if ('prompt' in request) return { ...params, ...(n !== undefined && { n }), model, prompt: request.prompt };
  // Asked as floats whatever the line's encoding_format: regen checks the values, and writes base64 itself (domain/run-endpoint.ts).
  return { ...params, model, input: request.input, encoding_format: 'float' };
}
