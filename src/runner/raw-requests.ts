import { runEndpoint } from '../domain/run-endpoint.js';
import type { SampleError } from '../domain/sample-errors.js';
import { wellFormedText } from '../domain/text.js';
import type { LiveEndpoint } from './live-endpoint.js';
import { type AnswerLimits, type ParsedAnswer, parseAnswers } from './request.js';

// The requests of completions and embeddings runs (README "OpenAI Batch API"): the body for a raw
// prompt or an input, the server route each kind goes to, and an embedding answer read and checked.

/** The request options of the openai client that regen sets on every request. */
type CallOptions = { signal: AbortSignal; timeout: number; headers: Record<string, string>; fetchOptions: object };

/** Sends a buffered request to the route its body is for. */
export function postBuffered(e: LiveEndpoint, body: Record<string, unknown>, options: CallOptions): Promise<unknown> {
  if ('input' in body) return e.client.embeddings.create(body as never, options);
  if ('prompt' in body) return e.client.completions.create(body as never, options);
  return e.client.chat.completions.create(body as never, options);
}

/**
 * The embeddings runs whose vector size this process remembers: one number a run, the oldest
 * forgotten past this many (a run forgotten learns its size again from its next answer).
 */
const REMEMBERED_RUNS = 256;

/**
 * Reads 200 answers by what their run asked: an embedding, else one choice's text per sample
 * (parseAnswers). Every vector of an embeddings run must be as long as its first: an index holds
 * one size, and a server of another size under the same model name (another model, or one cut to
 * fewer dimensions) would otherwise mix two models' vectors unnoticed. A run that asks
 * `dimensions` is held to them; one that does not takes the size of the first vector this process
 * reads for it (kept per process: each replica learns it from its own first answer).
 */
export class AnswerReader {
  readonly #sizes = new Map<string, number>();
  /** Per run, the endpoints that answered one of its vectors at another size. */
  readonly #otherSize = new Map<string, Set<string>>();

  read(run: { id: string; endpoint: string | null }, res: unknown, limits: AnswerLimits, count: number, endpointId: string): ParsedAnswer[] {
    if (runEndpoint(run.endpoint) !== '/v1/embeddings') return parseAnswers(res, limits, count);
    const parsed = parseEmbedding(res, limits);
    if (!parsed.ok || limits.dimensions !== undefined) return [parsed];
    const size = parsed.answer.embedding?.length ?? 0;
    const learned = this.#sizes.get(run.id);
    if (learned === undefined) {
      if (this.#sizes.size >= REMEMBERED_RUNS) {
        const oldest = this.#sizes.keys().next().value as string;
        this.#sizes.delete(oldest);
        this.#otherSize.delete(oldest);
      }
      this.#sizes.set(run.id, size);
    }
    if (learned === undefined || learned === size) return [parsed];
    const other = this.#otherSize.get(run.id) ?? new Set<string>();
    this.#otherSize.set(run.id, other.add(endpointId));
    return [
      malformed(`the endpoint answered an embedding of ${size} dimensions where the run's others have ${learned}: it may serve another model of the same name`),
    ];
  }

  /**
   * Whether a run's samples stay off an endpoint: it answered the run's vectors at another size, and
   * another of `serving` (the endpoints that may take the run's model now) has not. Asked again there, each
   * would only come back malformed: a sample the fleet's order kept handing that endpoint was asked
   * again for minutes, its server faults refunded and its waits doubling (test/batch-endpoints.test.ts).
   * With every endpoint of the model so marked, none is avoided: the faults then run their course.
   */
  avoids(runId: string, endpointId: string, serving: () => Iterable<string>): boolean {
    const other = this.#otherSize.get(runId);
    if (!other?.has(endpointId)) return false;
    for (const id of serving()) if (!other.has(id)) return true;
    return false;
  }
}

const malformed = (message: string): ParsedAnswer => ({ ok: false, error: { code: 'malformed_response', message, status: null } satisfies SampleError });

/**
 * An embeddings answer: one vector of finite numbers, as long as `dimensions` asked when it asked
 * (SGLang answers NaN as a bare `NaN`, which no JSON parser takes, and a vector cut or padded would
 * pass unnoticed into an index). Anything else is the server's broken answer, asked again.
 */
export function parseEmbedding(res: unknown, limits: AnswerLimits & { dimensions?: number }): ParsedAnswer {
  const r = res as { data?: { embedding?: unknown }[]; model?: unknown; usage?: { prompt_tokens?: unknown } } | null;
  const embedding = Array.isArray(r?.data) ? r.data[0]?.embedding : undefined;
  if (!Array.isArray(embedding) || embedding.length === 0) return malformed('the endpoint answered 200 without an embedding');
  const bad = embedding.findIndex((v) => typeof v !== 'number' || !Number.isFinite(v));
  if (bad !== -1)
    return malformed(`the endpoint answered an embedding whose value ${bad} is ${String(JSON.stringify(embedding[bad])).slice(0, 40)}, not a finite number`);
  if (limits.dimensions !== undefined && embedding.length !== limits.dimensions)
    return malformed(`the endpoint answered an embedding of ${embedding.length} dimensions, not the ${limits.dimensions} asked`);
  const prompt = r?.usage?.prompt_tokens;
  const context = limits.contextLength ?? Number.POSITIVE_INFINITY;
  if (!(Number.isInteger(prompt) && (prompt as number) >= 0 && (prompt as number) <= context))
    return malformed(`the endpoint reported usage.prompt_tokens ${String(JSON.stringify(prompt)).slice(0, 40)}, not a whole number within the context`);
  return {
    ok: true,
    answer: {
      content: null,
      reasoning: null,
      toolCalls: null,
      finishReason: null,
      logprobs: null,
      usage: { prompt_tokens: prompt as number, completion_tokens: 0, reasoning_tokens: 0, cached_tokens: 0 },
      model: typeof r?.model === 'string' ? wellFormedText(r.model) : null,
      responseId: undefined,
      created: undefined,
      embedding: embedding as number[],
    },
  };
}

/** Whether a body can be streamed for the loop watch: chat completions only (a raw prompt's text is not watched). */
export const streamable = (body: Record<string, unknown>): boolean => 'messages' in body && body.logprobs !== true;
