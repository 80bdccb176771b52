import { SimHttpError } from './http.js';
import { CHARS_PER_TOKEN, hashSeed, seededRandom } from './text.js';

// SGLang's /v1/completions and /v1/embeddings (serving_completions.py, serving_embedding.py), as
// far as regen relies on them: a raw prompt answered as a `text_completion`, and an input embedded
// as a deterministic unit vector.

const badRequest = (message: string): SimHttpError => new SimHttpError(400, message, 'Bad Request');
const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** A prompt or an input as text: token ids stand for a token each. */
function promptText(value: unknown, field: string): string {
  if (typeof value === 'string' && value.trim() !== '') return value;
  if (Array.isArray(value) && value.length > 0 && value.every((t) => Number.isInteger(t) && t >= 0)) return value.map((t) => `t${t}`).join(' ');
  throw badRequest(`\`${field}\` must be a non-empty string or a non-empty list of token ids.`);
}

/**
 * A completion request as the chat request the simulator answers: the prompt as one user turn and
 * no thinking (no chat template puts a think block in a raw prompt). `echo` is what to put before
 * the text, or null.
 */
export function completionAsChat(body: unknown): { chat: Record<string, unknown>; echo: string | null } {
  if (!isRecord(body)) throw badRequest('The request body must be a JSON object.');
  if (body.stream === true) throw badRequest('The simulator does not stream completions.');
  const text = promptText(body.prompt, 'prompt');
  const { prompt: _prompt, echo, logprobs: _logprobs, ...rest } = body;
  return {
    chat: { ...rest, messages: [{ role: 'user', content: text }], chat_template_kwargs: { enable_thinking: false } },
    echo: echo === true ? (typeof body.prompt === 'string' ? body.prompt : text) : null,
  };
}

/** A chat.completion body answered as SGLang's text_completion: each choice's message text as `text`. */
export function asTextCompletion(body: Record<string, unknown>, echo: string | null): Record<string, unknown> {
  const choices = (body.choices as { index: number; message: { content: string | null }; finish_reason: string; matched_stop: unknown }[]).map((c) => ({
    index: c.index,
    text: `${echo ?? ''}${c.message.content ?? ''}`,
    logprobs: null,
    finish_reason: c.finish_reason,
    matched_stop: c.matched_stop,
  }));
  const usage = body.usage as Record<string, unknown>;
  return {
    id: body.id,
    object: 'text_completion',
    created: body.created,
    model: body.model,
    choices,
    usage: {
      prompt_tokens: usage.prompt_tokens,
      completion_tokens: usage.completion_tokens,
      total_tokens: usage.total_tokens,
      prompt_tokens_details: usage.prompt_tokens_details,
    },
  };
}

/**
 * SGLang's embeddings body for one input: a unit vector drawn from the input's hash, so the same
 * input gets the same embedding on every run; `dimensions` sets its size. "[nan]" in the input
 * makes a broken answer, a value null (what a NaN becomes when a client's JSON writer meets one).
 */
export function embeddingReply(body: unknown, model: { model: string; contextLength: number; embeddingDimensions: number }): Record<string, unknown> {
  const { contextLength } = model;
  if (!isRecord(body)) throw badRequest('The request body must be a JSON object.');
  const text = promptText(body.input, 'input');
  const dimensions = body.dimensions ?? model.embeddingDimensions;
  if (!(Number.isInteger(dimensions) && (dimensions as number) > 0)) throw badRequest('`dimensions` must be a positive integer.');
  const promptTokens = Math.max(1, Array.isArray(body.input) ? body.input.length : Math.ceil(text.length / CHARS_PER_TOKEN));
  if (promptTokens >= contextLength) {
    throw new SimHttpError(400, `The input (${promptTokens} tokens) is longer than the model's context length (${contextLength} tokens).`);
  }
  const random = seededRandom(hashSeed(`embedding:${text}`));
  const raw = Array.from({ length: dimensions as number }, () => random() * 2 - 1);
  const norm = Math.hypot(...raw) || 1;
  const embedding: (number | null)[] = raw.map((v) => v / norm);
  if (text.includes('[nan]')) embedding[0] = null;
  return {
    object: 'list',
    data: [{ object: 'embedding', embedding, index: 0 }],
    model: typeof body.model === 'string' ? body.model : model.model,
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens },
  };
}
