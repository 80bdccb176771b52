import { APIConnectionError, APIConnectionTimeoutError, APIError, APIUserAbortError } from 'openai';
import type { ChoiceLogprobs, OtherChoice, Usage } from '../domain/output-line.js';
import { type TurnRecord, turnMessages } from '../domain/conversation.js';
import { layeredParams, thinkingRequested, walkSettings } from '../domain/run-settings.js';
import type { AnswerRepair } from '../domain/metrics.js';
import { readToolCalls, type ToolCall } from '../domain/tools.js';
import type { SampleError } from '../domain/sample-errors.js';
import { wellFormedText } from '../domain/text.js';
import { jsonTextNestsDeeperThan, MAX_JSON_DEPTH } from '../domain/json-depth.js';
import { answerBytes } from '../domain/answer-bytes.js';
import type { Variant } from '../domain/variants.js';
import { AnswerRefused } from './answer-budget.js';
import { isRaw, rawBody } from '../domain/raw-request.js';
import type { GenerationIds } from '../domain/token-rows.js';
import type { TurnedAwayReason } from '../domain/turned-away.js';

// One request to an endpoint: the body sent for a sample, what its answer means, and what its
// error means. Pure, so that every answer and error shape has a case in a table test.

/** A stored request: what ingest kept of the input line. */
export interface StoredRequest {
  messages: unknown[];
  params?: Record<string, unknown>;
  /** The line's own fields (`metadata`, or as written `metadata_json`), for the output line only: never sent. */
  metadata?: Record<string, unknown>;
  metadata_json?: Record<string, string>;
}

/**
 * Offset between the seeds of successive quality retries. A prime, so that the retries of
 * neighbouring base seeds do not land on each other's seeds; a random part on top keeps two runs
 * with the same seed from asking the same retry.
 */
const RETRY_SEED_STRIDE = 7919;
const RETRY_SEED_JITTER = 1000;

export interface BuiltRequest {
  body: Record<string, unknown>;
  /** Thinking was asked for this sample (a line's own params may turn it on or off). */
  thinking: boolean;
}

/**
 * The chat completion body for a sample: the run's params, its variant's over them, the line's own
 * over both, the run's model; a max_tokens an on_length retry raised over all of them. `choices`
 * answers of the line are asked at once (`n`; the run's params.n is the most): a line's pending
 * answers go as one request, and one asked again alone goes with no `n`.
 */
export function buildRequest(
  run: {
    model: string;
    params: Record<string, unknown>;
    variants?: readonly Pick<Variant, 'params'>[] | null;
    toolPairing?: string | null;
    historyReasoning?: string | null;
  },
  sample: { request: string; qualityRetries: number; variant?: number | null; maxTokens?: number | null; turn?: number | null; history?: TurnRecord[] },
  random: () => number = Math.random,
  choices = 1,
): BuiltRequest {
  const request = JSON.parse(sample.request) as StoredRequest;
  const variant = sample.variant === null || sample.variant === undefined ? null : run.variants?.[sample.variant]?.params;
  const params = layeredParams(run.params, variant, request.params);
  // A batch's line may ask n choices of its own, kept in one answer (OpenAI's shape).
  const own = request.params?.n;
  const n = choices > 1 ? choices : typeof own === 'number' && own > 1 ? own : undefined;
  const { n: _n, ...rest } = params;
  // A conversation's request is asked with the replies and steps regenerated so far (domain/conversation.ts).
  const messages = () =>
    sample.turn == null ? request.messages : turnMessages(request.messages as { role: string }[], sample.history ?? [], walkSettings(run));
  const body = isRaw(request) ? rawBody(request, rest, n, run.model) : { ...rest, ...(n !== undefined && { n }), model: run.model, messages: messages() };
  if (typeof sample.maxTokens === 'number') body[body.max_completion_tokens === undefined ? 'max_tokens' : 'max_completion_tokens'] = sample.maxTokens;
  if (sample.qualityRetries > 0) {
    // A flagged answer is asked again with a different seed, else SGLang would repeat it.
    const base = typeof params.seed === 'number' ? params.seed : 0;
    body.seed = base + sample.qualityRetries * RETRY_SEED_STRIDE + Math.floor(random() * RETRY_SEED_JITTER);
  }
  return { body, thinking: !isRaw(request) && thinkingRequested(params, run.model) };
}

/** The max_tokens a request asked (max_completion_tokens first, as SGLang reads them), or null when it asked none. */
export function askedMaxTokens(body: Record<string, unknown>): number | null {
  const asked = body.max_completion_tokens ?? body.max_tokens;
  return typeof asked === 'number' ? asked : null;
}

/**
 * The most tokens a request may generate: its max_tokens (max_completion_tokens first, as SGLang
 * reads them), else the server's context length, what SGLang caps it at (the prompt's own tokens
 * are not known before the answer, so this is an upper bound).
 */
export function tokenBudget(body: Record<string, unknown>, contextLength: number | null): number {
  const asked = body.max_completion_tokens ?? body.max_tokens;
  return typeof asked === 'number' ? asked : (contextLength ?? 0);
}

/**
 * The context taken for a server that does not report one (`max_model_len` missing from
 * /v1/models): the largest max_tokens a run may ask (domain/params.ts), so nothing a run could ask
 * for is refused.
 */
const UNKNOWN_CONTEXT_TOKENS = 10_000_000;

/** What a request allows its answer: the server's context length and the choices asked for. */
export interface AnswerLimits {
  contextLength: number | null;
  /** The request's `n`. */
  choices: number;
  /** An embedding's `dimensions`, when the request asked for them. */
  dimensions?: number;
}

export function answerLimits(body: Record<string, unknown>, contextLength: number | null): AnswerLimits {
  const dimensions = typeof body.dimensions === 'number' ? { dimensions: body.dimensions } : {};
  return { contextLength, choices: typeof body.n === 'number' && body.n >= 1 ? body.n : 1, ...dimensions };
}

/**
 * The most bytes an answer to this request can hold: its tokens (max_tokens, capped at the
 * context) for each choice (domain/answer-bytes.ts). An answer past it is not one the request
 * could produce.
 */
export function answerByteLimit(body: Record<string, unknown>, limits: AnswerLimits): number {
  const context = limits.contextLength ?? UNKNOWN_CONTEXT_TOKENS;
  const asked = body.max_completion_tokens ?? body.max_tokens;
  const tokens = typeof asked === 'number' && asked > 0 ? Math.min(asked, context) : context;
  return answerBytes(body, tokens, limits.choices);
}

/**
 * A 200's JSON text (a whole answer or one streamed event) as a value, or refused as the server's
 * malformed_response: `notJson` when it is not JSON, or nested past MAX_JSON_DEPTH, which no
 * answer is and which would cost the parse seconds and overflow the stack of what reads it after.
 */
export function readAnswerJson(text: string, notJson: string): unknown {
  if (jsonTextNestsDeeperThan(text))
    throw new AnswerRefused('malformed_response', `the endpoint answered 200 with JSON nested deeper than ${MAX_JSON_DEPTH} levels`);
  try {
    return JSON.parse(text);
  } catch {
    throw new AnswerRefused('malformed_response', notJson);
  }
}

/** A streamed answer cut by regen because it looped: kept as it stood, with SGLang's word for an aborted request. */
export const LOOP_FINISH_REASON = 'abort';

/** The parts of a chat completion regen reads; anything may be missing from a broken server. */
export interface ChatResponse {
  id?: string;
  created?: number;
  model?: string;
  choices?: {
    index?: number;
    message?: { content?: unknown; reasoning_content?: unknown; tool_calls?: unknown };
    /** A completion's (`/v1/completions`) text, where a chat completion has its message. */
    text?: unknown;
    logprobs?: unknown;
    finish_reason?: string | null;
  }[];
  usage?: {
    prompt_tokens?: number;
    completion_tokens?: number;
    reasoning_tokens?: number;
    completion_tokens_details?: { reasoning_tokens?: number };
    prompt_tokens_details?: { cached_tokens?: number } | null;
  };
}

export interface Answer {
  /** Without unpaired surrogates (replaced by U+FFFD): every output format holds the same text. */
  content: string | null;
  reasoning: string | null;
  /** The calls the answer made (a tool-call parser's `tool_calls`); null when it made none. */
  toolCalls: ToolCall[] | null;
  finishReason: string | null;
  /** Present when the request asked for them (`logprobs: true`). */
  logprobs: ChoiceLogprobs | null;
  usage: Usage;
  model: string | null;
  responseId: string | undefined;
  created: number | undefined;
  /** The other choices of an answer kept whole (choices.ts otherChoices). */
  others?: OtherChoice[];
  /** What was mended in it, when anything was; a usage repair is the request's, on each of its choices. */
  repairs?: AnswerRepair[];
  /** An embeddings run's answer (raw-requests.ts parseEmbedding). */
  embedding?: number[];
  /** The server's token ids for it, when the run writes them (output.tokens) and they were checked. */
  ids?: GenerationIds;
}

export type ParsedAnswer = { ok: true; answer: Answer } | { ok: false; error: SampleError };

/** The finish reasons SGLang sends for a finished completion (docs/sglang.md "Chat completions"). */
const FINISHED = new Set(['stop', 'length', 'tool_calls', 'content_filter', 'function_call']);
const MAX_REASON_CHARS = 40;

/**
 * Reads a 200 answer. One without a first choice is malformed; one the server aborted
 * (`finish_reason: "abort"`, with partial or no text) is not a completion; a finish reason SGLang
 * does not send, or token counts the request cannot have (usageProblem, against `limits`; without
 * them no context is known), are taken for a broken answer, not a success. All are tried again.
 */
export function parseAnswer(res: unknown, limits: AnswerLimits = { contextLength: null, choices: 1 }): ParsedAnswer {
  return parseAnswers(res, limits, 1)[0];
}

const malformed = (message: string): ParsedAnswer => ({ ok: false, error: { code: 'malformed_response', message, status: null } });

/**
 * Reads a 200 answer to a request of `count` choices (`n`): one result per choice, by its
 * `index` (by position when the server sends none), each read as parseAnswer reads the first. The
 * request's usage is the same on every one (SGLang reports one for all n; see shareUsage). A
 * missing or broken choice is that choice's error alone; a body without choices or with
 * impossible token counts is every choice's.
 */
export function parseAnswers(res: unknown, limits: AnswerLimits, count: number): ParsedAnswer[] {
  const r = res as ChatResponse | null;
  const all = (p: ParsedAnswer) => Array.from({ length: count }, () => p);
  if (!r || typeof r !== 'object' || !Array.isArray(r.choices) || !r.choices[0]) return all(malformed('the endpoint answered 200 without choices'));
  const u = r.usage ?? {};
  const usage: Usage = {
    prompt_tokens: u.prompt_tokens ?? 0,
    completion_tokens: u.completion_tokens ?? 0,
    // SGLang reports reasoning tokens at the top level of usage; OpenAI under completion_tokens_details.
    reasoning_tokens: u.reasoning_tokens ?? u.completion_tokens_details?.reasoning_tokens ?? 0,
    cached_tokens: u.prompt_tokens_details?.cached_tokens ?? 0,
  };
  const wrong = usageProblem(usage, limits);
  const usageRepairs = wrong ? [] : clampUsage(usage);
  const choices = r.choices;
  return Array.from({ length: count }, (_, i) => {
    const choice = choices.find((c) => c?.index === i) ?? (choices[i]?.index === undefined ? choices[i] : undefined);
    if (!choice) return malformed(`the endpoint answered without choice ${i} of the ${count} asked`);
    const reason = choice.finish_reason;
    if (reason === 'abort') return { ok: false, error: { code: 'aborted', message: 'the server aborted the request (finish_reason "abort")', status: null } };
    if (typeof reason !== 'string' || !FINISHED.has(reason)) {
      const shown = typeof reason === 'string' ? JSON.stringify(reason.slice(0, MAX_REASON_CHARS)) : String(reason);
      return malformed(`the endpoint answered with finish_reason ${shown}`);
    }
    if (wrong) return malformed(`the endpoint reported ${wrong}`);
    const msg = choice.message ?? {};
    const repairs = [...usageRepairs];
    const text = (v: unknown): string | null => {
      if (typeof v !== 'string') return null;
      const fixed = wellFormedText(v);
      if (fixed !== v && !repairs.includes('lone_surrogates_replaced')) repairs.push('lone_surrogates_replaced');
      return fixed;
    };
    return {
      ok: true,
      answer: {
        content: text(msg.content ?? choice.text),
        reasoning: text(msg.reasoning_content),
        toolCalls: readToolCalls(msg.tool_calls),
        finishReason: reason,
        logprobs: typeof choice.logprobs === 'object' && choice.logprobs !== null ? (choice.logprobs as ChoiceLogprobs) : null,
        usage,
        model: text(r.model),
        responseId: typeof r.id === 'string' ? (text(r.id) ?? undefined) : r.id,
        created: r.created,
        ...(repairs.length > 0 && { repairs }),
      },
    };
  });
}

/**
 * Clamps, in place, a count past the count it is part of: cached tokens past the prompt's, reasoning
 * tokens past the completion's. The answer's text is sound and asking again would spend the GPUs
 * on it a second time, while an impossible part would give a cache hit rate above 1 on the run,
 * its endpoints and /metrics for good (docs/sglang.md). Returns what it clamped.
 */
function clampUsage(usage: Usage): AnswerRepair[] {
  const repairs: AnswerRepair[] = [];
  if (usage.cached_tokens > usage.prompt_tokens) {
    usage.cached_tokens = usage.prompt_tokens;
    repairs.push('cached_tokens_clamped');
  }
  if (usage.reasoning_tokens > usage.completion_tokens) {
    usage.reasoning_tokens = usage.completion_tokens;
    repairs.push('reasoning_tokens_clamped');
  }
  return repairs;
}

/**
 * A token count no answer to the request can have, named, or null when all are possible: each a
 * whole number from 0; the prompt within the context; the generated, reasoning and cached tokens
 * within the context for each choice (SGLang sums them over the `n` choices). A run's usage and
 * /metrics add these up, so one absurd count would spoil them for good.
 */
function usageProblem(usage: Usage, limits: AnswerLimits): string | null {
  const context = limits.contextLength ?? UNKNOWN_CONTEXT_TOKENS;
  const ceilings: Record<keyof Usage, number> = {
    prompt_tokens: context,
    completion_tokens: context * limits.choices,
    reasoning_tokens: context * limits.choices,
    cached_tokens: context * limits.choices,
  };
  for (const [field, ceiling] of Object.entries(ceilings) as [keyof Usage, number][]) {
    const value: unknown = usage[field];
    if (typeof value !== 'number' || !Number.isInteger(value) || value < 0) return `usage.${field} ${shownCount(value)}, not a whole number from 0`;
    if (value > ceiling) return `usage.${field} ${shownCount(value)}, more than the request allows (${ceiling})`;
  }
  return null;
}

const MAX_SHOWN_COUNT_CHARS = 40;
const shownCount = (value: unknown) => String(JSON.stringify(value)).slice(0, MAX_SHOWN_COUNT_CHARS);

/** What a failed request means for its sample and its endpoint. */
export type ErrorVerdict =
  /** The sample's error; `transport` ones count against the endpoint's health. */
  | { kind: 'error'; error: SampleError; transport: boolean }
  /** The endpoint, not the sample, is wrong (bad key, wrong URL): probe it again; the sample meets a server fault. */
  | { kind: 'endpoint_refused'; reason: string; error: SampleError }
  /** The server turned the request away for a while (its choice): the sample goes back unspent, the endpoint backs off. */
  | { kind: 'turned_away'; reason: TurnedAwayReason; retryAfterMs: number | null; message: string }
  /** The server refuses the `priority` field regen sent: it is sent no more there, and the sample goes back unspent. */
  | { kind: 'priority_refused'; message: string };

/**
 * What a server launched without priority scheduling answers to a request with `priority`: a 400
 * that says so, as vLLM's "Priority scheduling is not enabled." (SGLang ignores the field there).
 */
const PRIORITY_REFUSED = /priority\b.*\b(not enabled|disabled)/i;
/** The gateway's header on a 503 that shed a bulk request (docs/sglang.md "Priority"). */
const PREEMPTED_HEADER = 'x-smg-preempted';
/** The longest Retry-After taken as said: a server asking for more is asked again after this. */
const MAX_RETRY_AFTER_MS = 10 * 60_000;

const MAX_ERROR_MESSAGE_CHARS = 1000;
const MAX_INTERNAL_MESSAGE_CHARS = 300;

/**
 * Classifies an error of the openai client. A request regen did not abort itself that ends in an
 * abort was cut by its own timeout.
 */
export function classifyError(err: unknown, timeoutMs: number, sentPriority = false, now = Date.now()): ErrorVerdict {
  // agentFetch's refusals reach here as the cause of the openai client's connection error.
  const refused = err instanceof AnswerRefused ? err : err instanceof APIConnectionError && err.cause instanceof AnswerRefused ? err.cause : null;
  if (refused) return { kind: 'error', error: { code: refused.code, message: refused.message, status: null }, transport: false };
  if (err instanceof APIConnectionTimeoutError || err instanceof APIUserAbortError) {
    // Not held against the endpoint: long generations on a busy server time out together, and
    // a server that has really hung fails its health probe.
    return { kind: 'error', error: { code: 'timeout', message: `no answer within ${timeoutMs} ms`, status: null }, transport: false };
  }
  if (err instanceof APIConnectionError) {
    return { kind: 'error', error: { code: 'connection_error', message: 'the connection to the endpoint failed', status: null }, transport: true };
  }
  if (err instanceof APIError && err.status) {
    const status = err.status;
    const message = errorMessage(err);
    const turnedAway =
      status === 429 ? 'rate_limited' : status === 408 ? 'gateway_timeout' : status === 503 && err.headers?.has(PREEMPTED_HEADER) ? 'preempted' : null;
    if (turnedAway) return { kind: 'turned_away', reason: turnedAway, retryAfterMs: retryAfterMs(err.headers?.get('retry-after') ?? null, now), message };
    if (sentPriority && status === 400 && PRIORITY_REFUSED.test(message)) return { kind: 'priority_refused', message };
    if (status >= 500 || status === 409 || status === 425) {
      return { kind: 'error', error: { code: 'server_error', message, status }, transport: false };
    }
    if (status === 401 || status === 403 || status === 404) {
      return {
        kind: 'endpoint_refused',
        reason: `${status}: ${message}`.slice(0, MAX_INTERNAL_MESSAGE_CHARS),
        error: { code: 'endpoint_refused', message, status },
      };
    }
    return { kind: 'error', error: { code: 'invalid_request', message, status }, transport: false };
  }
  const message = (err as Error)?.message?.slice(0, MAX_INTERNAL_MESSAGE_CHARS) ?? 'unknown error';
  return { kind: 'error', error: { code: 'internal_error', message, status: null }, transport: false };
}

/** A Retry-After header (seconds, or an HTTP date) as milliseconds from `now`, at most MAX_RETRY_AFTER_MS; null when absent or unreadable. */
export function retryAfterMs(header: string | null, now: number): number | null {
  if (header === null) return null;
  const value = header.trim();
  const ms = /^\d+$/.test(value) ? Number(value) * 1000 : Date.parse(value) - now;
  return Number.isNaN(ms) ? null : Math.min(MAX_RETRY_AFTER_MS, Math.max(0, ms));
}

/** SGLang's error body is `{object: "error", message, ...}`; keep its message, bounded. */
function errorMessage(err: APIError): string {
  const body = err.error as { message?: unknown } | undefined;
  const m = typeof body?.message === 'string' ? body.message : err.message;
  return m.slice(0, MAX_ERROR_MESSAGE_CHARS);
}
