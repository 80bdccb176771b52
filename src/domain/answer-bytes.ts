// The most bytes one answer can hold while it arrives, from what its request asks: what bounds
// each answer in flight (runner/answer-budget.ts), and what a run is checked against at creation
// and each line at validation, so that a run whose one answer can never fit the memory all answers
// in flight share (REGEN_ANSWER_BUFFER_BYTES) is refused before it is dispatched.

/**
 * Bytes one generated token may take while its answer is held: a token is a few characters, at
 * most a few dozen (runs of spaces or dashes); escaped in JSON a character takes up to 6 bytes, and
 * held as a streamed piece two bytes and a string header (answer-budget.ts
 * HELD_STRING_OVERHEAD_BYTES). Real answers average under 8 bytes a token, so only a broken server
 * comes near this.
 */
export const BYTES_PER_TOKEN = 128;
/** Each token's entry in `logprobs` (token, logprob, its bytes as numbers), once for itself and once per top_logprobs alternative. */
const LOGPROB_ENTRY_BYTES = 256;
/** An answer's envelope around its text: id, model, usage, metadata, and any error body. */
const ANSWER_ENVELOPE_BYTES = 64 * 1024;

/** The most bytes an answer of `tokens` tokens for each of `choices` choices can hold, at BYTES_PER_TOKEN and their log probabilities when the body asks them. */
export function answerBytes(body: Record<string, unknown>, tokens: number, choices: number): number {
  // A completion asks its alternatives per token as `logprobs: k`, a chat completion as `top_logprobs`.
  const alternatives = typeof body.logprobs === 'number' ? body.logprobs : body.top_logprobs;
  const top = typeof alternatives === 'number' && alternatives > 0 ? alternatives : 0;
  const perToken = BYTES_PER_TOKEN + (body.logprobs === true || typeof body.logprobs === 'number' ? LOGPROB_ENTRY_BYTES * (1 + top) : 0);
  return ANSWER_ENVELOPE_BYTES + choices * (tokens + echoedTokens(body)) * perToken;
}

/** A completion with `echo` gives its prompt back before each choice's text: at most a token a character, or its token ids. */
function echoedTokens(body: Record<string, unknown>): number {
  if (body.echo !== true) return 0;
  return typeof body.prompt === 'string' || Array.isArray(body.prompt) ? body.prompt.length : 0;
}

export const ANSWER_BUFFER_SETTING = 'REGEN_ANSWER_BUFFER_BYTES';

/**
 * Why one answer to these params (a run's, a variant's over them, a line's over both) can never fit
 * in `bufferBytes`, or null when it can: its `n` choices of `max_tokens` each (max_completion_tokens
 * first, as SGLang reads them). Without a max_tokens the answer is bounded by the server's context,
 * known only once an endpoint is probed: dispatch bounds it then.
 */
export function answerBufferProblem(params: Record<string, unknown>, bufferBytes: number): { field: string; message: string } | null {
  const field = params.max_completion_tokens !== undefined ? 'max_completion_tokens' : 'max_tokens';
  const asked = params[field];
  if (typeof asked !== 'number' || asked <= 0) return null;
  const n = typeof params.n === 'number' && params.n > 1 ? params.n : 1;
  const bytes = answerBytes(params, asked, n);
  if (bytes <= bufferBytes) return null;
  return {
    field,
    message:
      `one answer (n ${n} × ${field} ${asked} at ${BYTES_PER_TOKEN} bytes a token${params.logprobs === true ? ', with its logprobs' : ''}) may hold ` +
      `${bytes} bytes, more than ${ANSWER_BUFFER_SETTING} (${bufferBytes}), the memory all answers in flight share: ` +
      `lower ${field} or n, or raise ${ANSWER_BUFFER_SETTING}`,
  };
}
