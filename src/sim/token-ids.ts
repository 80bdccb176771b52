import { SimHttpError } from './http.js';
import type { Knobs } from './options.js';
import { CHARS_PER_TOKEN, callsText, hashSeed } from './text.js';

/**
 * Token ids as SGLang returns them (docs/sglang.md "Token ids"), from a deterministic
 * tokenization whose counts are the simulator's usage: a message is its four template tokens
 * (<|im_start|>, the role, a newline, <|im_end|>) around its text's tokens, the text of all the
 * messages cut every CHARS_PER_TOKEN characters as countPromptTokens counts it; an answer is its
 * generated text's tokens, the last one <|im_end|> when generation stopped on its own.
 */

// Qwen's ids for the template's special tokens and the newline; ordinary text ids stay below them.
const IM_START_ID = 151644;
const IM_END_ID = 151645;
const NEWLINE_ID = 198;
const TEXT_VOCAB = 151643;

/** Which ids a request asked for, as the server's version understands them. */
export interface IdAsk {
  /** vLLM's `return_token_ids`: prompt_token_ids at the top level, each choice's token_ids; streamed too. */
  vllm: boolean;
  /** `return_token_ids`: choices[].prompt_token_ids and choices[].token_ids; refused on a stream. */
  tokenIds: boolean;
  /** `return_prompt_token_ids`: choices[].prompt_token_ids only; refused on a stream. */
  promptTokenIds: boolean;
  /** `return_input_ids` (or `…_in_sglext`): sglext.input_ids, streamed too. */
  inputIds: boolean;
  /** `return_output_ids` (or `…_in_sglext`): sglext.output_ids, one list a choice, streamed too. */
  outputIds: boolean;
}

/** Every token-id parameter a request may carry, in the order a refusal names the first. */
const ID_PARAM_NAMES = [
  'return_token_ids',
  'return_prompt_token_ids',
  'return_input_ids',
  'return_output_ids',
  'return_input_ids_in_sglext',
  'return_output_ids_in_sglext',
] as const;

/** pydantic's words for a field the request model does not have. */
const unknownField = (name: string): SimHttpError =>
  new SimHttpError(400, `1 validation error for ChatCompletionRequest\n${name}\n  Extra inputs are not permitted`);

const asked = (body: Record<string, unknown>, name: string): boolean => body[name] === true || body[`${name}_in_sglext`] === true;

/**
 * The ids `body` asks for. The `tokenIdApi` knob is the server's version: `sglext` knows every
 * parameter, `token_ids` only `return_token_ids` and `return_prompt_token_ids` (before the sglext
 * ones), `vllm` is vLLM's `return_token_ids` (PR #22587), `none` none (an older server, whose
 * protocol ignores fields it does not know).
 */
export function parseIdAsk(body: Record<string, unknown>, knobs: Knobs): IdAsk {
  const api = knobs.tokenIdApi;
  const sglang = api === 'sglext' || api === 'token_ids';
  const ask: IdAsk = {
    vllm: api === 'vllm' && body.return_token_ids === true,
    tokenIds: sglang && body.return_token_ids === true,
    promptTokenIds: sglang && body.return_prompt_token_ids === true,
    inputIds: api === 'sglext' && asked(body, 'return_input_ids'),
    outputIds: api === 'sglext' && asked(body, 'return_output_ids'),
  };
  const named = ID_PARAM_NAMES.find((name) => body[name] === true);
  if (named && body.stream === true && knobs.refuseStreamedIds === 1) throw unknownField(named);
  if (named && knobs.refuseIdRequests > 0) {
    knobs.refuseIdRequests--;
    throw unknownField(named);
  }
  // serving_chat.py refuses these two on a stream, in this order, before anything is generated.
  if (body.stream === true && ask.promptTokenIds) {
    throw new SimHttpError(400, 'return_prompt_token_ids is not supported with streaming. Please set stream=false when using return_prompt_token_ids=true.');
  }
  if (body.stream === true && ask.tokenIds) {
    throw new SimHttpError(
      400,
      'return_token_ids is not supported with streaming on /v1/chat/completions. Please set stream=false when using return_token_ids=true.',
    );
  }
  return ask;
}

export const wantsIds = (ask: IdAsk): boolean => ask.vllm || ask.tokenIds || ask.promptTokenIds || ask.inputIds || ask.outputIds;

const textId = (text: string, start: number): number => hashSeed(text.slice(start, start + CHARS_PER_TOKEN)) % TEXT_VOCAB;

function messageText(message: Record<string, unknown>): string {
  const { content } = message;
  const text = typeof content === 'string' ? content : Array.isArray(content) ? content.map((p) => (typeof p?.text === 'string' ? p.text : '')).join('') : '';
  return text + callsText(message.tool_calls);
}

/** The prompt's ids: as many as countPromptTokens reports in usage.prompt_tokens. */
export function promptIds(messages: Record<string, unknown>[]): number[] {
  const texts = messages.map(messageText);
  const all = texts.join('');
  const ids: number[] = [];
  let start = 0;
  let next = 0;
  for (const [i, message] of messages.entries()) {
    ids.push(IM_START_ID, hashSeed(String(message.role)) % TEXT_VOCAB, NEWLINE_ID);
    start += texts[i].length;
    // The tokens that begin inside this message's text are its own.
    for (; next < start; next += CHARS_PER_TOKEN) ids.push(textId(all, next));
    ids.push(IM_END_ID);
  }
  return ids;
}

/**
 * A choice's generated ids: `tokens` of them (its usage), the text's tokens first (a short text
 * padded with the newline), <|im_end|> last when it `stopped` (stop, or a parsed tool call).
 */
export function answerIds(text: string, tokens: number, stopped: boolean): number[] {
  const body = stopped && tokens > 0 ? tokens - 1 : tokens;
  const ids = Array.from({ length: body }, (_, k) => (k * CHARS_PER_TOKEN < text.length ? textId(text, k * CHARS_PER_TOKEN) : NEWLINE_ID));
  if (body < tokens) ids.push(IM_END_ID);
  return ids;
}

export interface ChoiceIds {
  finishReason: string;
  text: string;
  tokens: number;
}

/**
 * The ids a reply carries, each only when asked: per-choice fields (SGLang's prompt_token_ids and
 * token_ids; vLLM's token_ids), the top-level prompt_token_ids (vLLM's) and sglext, and each
 * choice's generated ids for a stream to send piece by piece (vLLM's).
 */
export function replyIds(ask: IdAsk, prompt: number[], choices: ChoiceIds[], skew: boolean) {
  const outputs = choices.map((c) => answerIds(c.text, c.tokens, c.finishReason === 'stop' || c.finishReason === 'tool_calls'));
  // A server whose ids disagree with its usage (the tokenIdMismatchRate knob): one id short.
  if (skew && outputs[0].length > 0) outputs[0] = outputs[0].slice(1);
  const perChoice = outputs.map((ids) => ({
    ...((ask.tokenIds || ask.promptTokenIds) && { prompt_token_ids: prompt }),
    ...((ask.tokenIds || ask.vllm) && { token_ids: ids }),
  }));
  const sglext = ask.inputIds || ask.outputIds ? { ...(ask.inputIds && { input_ids: prompt }), ...(ask.outputIds && { output_ids: outputs }) } : null;
  return { perChoice, sglext, rootPrompt: ask.vllm ? prompt : null, streamed: ask.vllm ? outputs : null };
}
