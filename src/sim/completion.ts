import { randomUUID } from 'node:crypto';
import { SimHttpError } from './http.js';
import { isRecord, type Knobs } from './options.js';
import { parseIdAsk, promptIds, replyIds, wantsIds, type IdAsk } from './token-ids.js';
import { answerSequence, CHARS_PER_TOKEN, callsText, countPromptTokens, digestOf, fillerText, hashSeed, promptSequence, seededRandom } from './text.js';

/** Qwen's <|im_end|>: the token SGLang reports in `matched_stop` when generation stops on its own. */
const EOS_TOKEN_ID = 151645;

/** `--weight-version`'s default, reported in every reply's `metadata`. */
const WEIGHT_VERSION = 'default';

// A test hook, not SGLang: "[len=N]" in the last user message asks for an answer of N tokens.
const ANSWER_LENGTH = /\[len=(\d+)\]/;
// Another: "[loop]" makes the model loop, repeating one phrase until max_tokens, as a reasoning
// model caught in a loop does (in its reasoning when it thinks, else in its answer).
const LOOP_MARKER = '[loop]';
const LOOP_PHRASE = 'wait, let me check that again. ';
// Another: "[empty-choice=K]" makes choice K of a request for n > K choices the degenerate answer
// (an empty think block and a throwaway reply), so a test can see one choice of n flagged.
const EMPTY_CHOICE = /\[empty-choice=(\d+)\]/;
// Another: "[tools=a,b|c]" makes the model call tools: a and b side by side at the first step of
// the turn, c at the second, then answer. A step is an assistant message after the last user
// message; each call's arguments hold the digest of the messages it was asked with.
const TOOLS_MARKER = /\[tools=([^\]]*)\]/;
// SGLang's cap is the batch; this keeps a broken client from asking the simulator for millions.
const MAX_CHOICES = 128;

export interface ChatRequest {
  digest: string;
  /** The `model` the client sent, echoed back: SGLang never checks it. */
  model: string;
  promptTokens: number;
  /** The chat-templated prompt as the prefix cache's tokens. */
  sequence: number[];
  /** max_tokens, or what is left of the context when the client sent none (SGLang's own cap). */
  maxTokens: number;
  thinking: boolean;
  /** Answer length asked for with "[len=N]", else the completionTokens knob. */
  answerTokens: number;
  /** `logprobs: true` asks for each output token's log probability; `top_logprobs` for that many alternatives. */
  logprobs: boolean;
  topLogprobs: number;
  /** The prompt asks for a loop with "[loop]". */
  loop: boolean;
  /** `n`: choices decoded from the one prefill, each with its own index and finish_reason. */
  n: number;
  /** The choice "[empty-choice=K]" asks to be degenerate, or -1. */
  emptyChoice: number;
  /** `stream: true`: the answer goes out as server-sent events. */
  stream: boolean;
  /** `stream_options.include_usage`: a last chunk with empty choices carries the usage. */
  includeUsage: boolean;
  /** SGLang's `priority` (with --enable-priority-scheduling, larger goes first), or null when not sent. */
  priority: number | null;
  /** The functions "[tools=…]" asks this request to call; empty when it answers with text. */
  calls: string[];
  /** The token ids asked for, and the prompt's when any were. */
  ids: IdAsk;
  promptIds: number[] | null;
}

/** The functions the request's step calls: the "[tools=…]" marker's list for its step, the steps taken since the last user message. */
function stepCalls(messages: Record<string, unknown>[]): string[] {
  const marker = TOOLS_MARKER.exec(lastUserText(messages));
  if (!marker) return [];
  let lastUser = 0;
  for (const [i, m] of messages.entries()) if (m.role === 'user') lastUser = i;
  const step = messages.slice(lastUser + 1).filter((m) => m.role === 'assistant').length;
  const names = marker[1].split('|')[step];
  return names ? names.split(',').filter((n) => n !== '') : [];
}

// OpenAI's bound on `top_logprobs`, which SGLang's protocol checks too.
const MAX_TOP_LOGPROBS = 20;

const badRequest = (message: string): SimHttpError => new SimHttpError(400, message, 'Bad Request');

// Qwen3 thinks unless `enable_thinking: false`; reasoning_effort and reasoning only ask for the default.
function wantsThinking(body: Record<string, unknown>): boolean {
  const kwargs = body.chat_template_kwargs;
  if (isRecord(kwargs) && typeof kwargs.enable_thinking === 'boolean') return kwargs.enable_thinking;
  return true;
}

function lastUserText(messages: Record<string, unknown>[]): string {
  let lastUser: Record<string, unknown> | undefined;
  for (const message of messages) if (message.role === 'user') lastUser = message;
  return typeof lastUser?.content === 'string' ? lastUser.content : '';
}

function answerLength(text: string, knobs: Knobs): number {
  const match = ANSWER_LENGTH.exec(text);
  return match ? Number(match[1]) : knobs.completionTokens;
}

/** Checks a chat-completion body the way SGLang would, in the order it would complain. */
export function parseChatRequest(body: unknown, knobs: Knobs): ChatRequest {
  if (!isRecord(body)) throw badRequest('The request body must be a JSON object.');
  const { messages } = body;
  if (!Array.isArray(messages) || messages.length === 0 || !messages.every(isRecord)) {
    throw badRequest('`messages` must be a non-empty array of message objects.');
  }
  const maxTokens = body.max_completion_tokens ?? body.max_tokens ?? undefined;
  if (maxTokens !== undefined && !(Number.isInteger(maxTokens) && (maxTokens as number) > 0)) {
    throw badRequest('`max_tokens` must be a positive integer.');
  }
  // Both checks use >=, as tokenizer_manager._validate_one_request does.
  const { contextLength } = knobs;
  const promptTokens = countPromptTokens(messages);
  if (promptTokens >= contextLength) {
    throw new SimHttpError(400, `The input (${promptTokens} tokens) is longer than the model's context length (${contextLength} tokens).`);
  }
  if (typeof maxTokens === 'number' && promptTokens + maxTokens >= contextLength) {
    throw new SimHttpError(
      400,
      `Requested token count exceeds the model's maximum context length of ${contextLength} tokens. ` +
        `You requested a total of ${promptTokens + maxTokens} tokens: ${promptTokens} tokens from the input messages and ` +
        `${maxTokens} tokens for the completion. Please reduce the number of tokens in the input messages or the ` +
        'completion to fit within the limit.',
    );
  }
  const n = body.n ?? 1;
  if (!(Number.isInteger(n) && (n as number) >= 1 && (n as number) <= MAX_CHOICES)) throw badRequest(`\`n\` must be an integer from 1 to ${MAX_CHOICES}.`);
  const emptyChoice = EMPTY_CHOICE.exec(lastUserText(messages));
  const topLogprobs = body.top_logprobs ?? 0;
  if (!(Number.isInteger(topLogprobs) && (topLogprobs as number) >= 0 && (topLogprobs as number) <= MAX_TOP_LOGPROBS)) {
    throw badRequest(`\`top_logprobs\` must be an integer from 0 to ${MAX_TOP_LOGPROBS}.`);
  }
  const { priority } = body;
  if (priority !== undefined && priority !== null && !Number.isInteger(priority)) throw badRequest('`priority` must be an integer.');
  const ids = parseIdAsk(body, knobs);
  return {
    ids,
    promptIds: wantsIds(ids) ? promptIds(messages) : null,
    priority: (priority as number | undefined) ?? null,
    digest: digestOf(messages),
    model: typeof body.model === 'string' ? body.model : knobs.model,
    promptTokens,
    sequence: promptSequence(messages),
    maxTokens: typeof maxTokens === 'number' ? maxTokens : contextLength - promptTokens,
    thinking: wantsThinking(body),
    answerTokens: answerLength(lastUserText(messages), knobs),
    loop: lastUserText(messages).includes(LOOP_MARKER),
    n: n as number,
    emptyChoice: emptyChoice ? Number(emptyChoice[1]) : -1,
    stream: body.stream === true,
    includeUsage: body.stream === true && isRecord(body.stream_options) && body.stream_options.include_usage === true,
    logprobs: body.logprobs === true,
    topLogprobs: topLogprobs as number,
    calls: stepCalls(messages),
  };
}

interface Generated {
  reasoning: string;
  content: string;
  reasoningTokens: number;
  contentTokens: number;
  finishReason: 'stop' | 'length' | 'abort' | 'tool_calls';
  /** The calls made, as a tool-call parser gives them; their text is `content` until split. */
  toolCalls?: { id: string; type: 'function'; function: { name: string; arguments: string } }[];
}

// The reply text depends only on the prompt, the simulator's seed and the choice's index, so a
// rerun reproduces it; choice 0 is the text a request for one choice gets.
function generate(request: ChatRequest, knobs: Knobs, budget: number, choice = 0): Generated {
  if (request.loop) return looping(request, budget);
  if (request.calls.length) return calling(request, knobs, budget);
  const wantedReasoning = request.thinking ? knobs.reasoningTokens : 0;
  const reasoningTokens = Math.min(wantedReasoning, budget);
  const contentTokens = Math.min(request.answerTokens, budget - reasoningTokens);
  // Separate streams so a cut reasoning leaves the answer's words unchanged.
  const seed = choice === 0 ? `${request.digest}:${knobs.seed}` : `${request.digest}:${knobs.seed}:choice${choice}`;
  return {
    reasoning: fillerText(`Reasoning about ${request.digest}. `, reasoningTokens, seededRandom(hashSeed(`${seed}:reasoning`))),
    content: fillerText(`Answer ${request.digest}: `, contentTokens, seededRandom(hashSeed(`${seed}:content`))),
    reasoningTokens,
    contentTokens,
    finishReason: wantedReasoning + request.answerTokens > budget ? 'length' : 'stop',
  };
}

/** A step: the reasoning, then the calls (their arguments naming the request's digest), as the template writes them. */
function calling(request: ChatRequest, knobs: Knobs, budget: number): Generated {
  const reasoningTokens = Math.min(request.thinking ? knobs.reasoningTokens : 0, budget);
  const toolCalls = request.calls.map((name, k) => ({
    id: `call_${hashSeed(`${request.digest}:${k}`).toString(16).padStart(8, '0')}${k}`,
    type: 'function' as const,
    function: { name, arguments: JSON.stringify({ digest: request.digest, call: k }) },
  }));
  const content = callsText(toolCalls);
  return {
    reasoning: fillerText(`Reasoning about ${request.digest}. `, reasoningTokens, seededRandom(hashSeed(`${request.digest}:${knobs.seed}:reasoning`))),
    content,
    reasoningTokens,
    contentTokens: Math.ceil(content.length / CHARS_PER_TOKEN),
    finishReason: 'tool_calls',
    toolCalls,
  };
}

// The loop never ends on its own: it fills the budget and stops on length.
function looping(request: ChatRequest, budget: number): Generated {
  let text = '';
  while (text.length < budget * CHARS_PER_TOKEN) text += LOOP_PHRASE;
  text = text.slice(0, budget * CHARS_PER_TOKEN);
  if (request.thinking) return { reasoning: text, content: '', reasoningTokens: budget, contentTokens: 0, finishReason: 'length' };
  return { reasoning: '', content: text, reasoningTokens: 0, contentTokens: budget, finishReason: 'length' };
}

// The failure regen exists to catch: an empty think block and a throwaway answer.
function degenerate(): Generated {
  return { reasoning: '', content: 'OK.', reasoningTokens: 0, contentTokens: 2, finishReason: 'stop' };
}

/**
 * What the client sees of the text. With the Qwen3 parser the think block goes to
 * `reasoning_content` (null when empty), and a block cut before it closes takes all the
 * text; without a parser the block stays inside `content`, tags and all.
 */
function split(out: Generated, request: ChatRequest, parser: boolean): { content: string; reasoning: string | null } {
  if (!request.thinking) return { content: out.content, reasoning: null };
  if (out.toolCalls) return { content: out.content, reasoning: parser ? out.reasoning : null };
  const closed = out.contentTokens > 0 || out.finishReason === 'stop';
  if (parser) return { content: closed ? out.content : '', reasoning: out.reasoning === '' ? null : out.reasoning };
  return { content: closed ? `<think>\n${out.reasoning}\n</think>\n\n${out.content}` : `<think>\n${out.reasoning}`, reasoning: null };
}

/**
 * SGLang's `choices[].logprobs`: one entry per output token, the thinking's included (the
 * simulator's tokens are CHARS_PER_TOKEN characters of the text), with `top_logprobs`
 * alternatives each; it has no `refusal` list.
 */
function tokenLogprobs(text: string, tokens: number, top: number, random: () => number) {
  const entry = (token: string, logprob: number) => ({ token, logprob, bytes: [...Buffer.from(token)] });
  return {
    content: Array.from({ length: tokens }, (_, i) => {
      const token = text.slice(i * CHARS_PER_TOKEN, (i + 1) * CHARS_PER_TOKEN);
      const logprob = -random();
      const alternatives = Array.from({ length: top }, (_, k) => entry(k === 0 ? token : `alt${k}`, k === 0 ? logprob : logprob - k));
      return { ...entry(token, logprob), top_logprobs: alternatives };
    }),
  };
}

export interface Reply {
  body: object;
  /** Generated tokens of all choices (what usage reports). */
  completionTokens: number;
  /** The longest choice's tokens: the n choices decode side by side, so this times the reply. */
  decodeTokens: number;
  /** What the model generated for choice 0, as the prefix cache's tokens (its thinking included). */
  generated: number[];
  /** The answer token by token, for a streamed reply: one SSE chunk each (SGLang's default stream_interval of 1). */
  pieces: Piece[];
  /** vLLM's streamed ids: each choice's generated ids its pieces did not carry, sent on its finish event. */
  finishIds: number[][] | null;
}

export interface Piece {
  /** The choice the piece belongs to. */
  index: number;
  field: 'content' | 'reasoning_content' | 'tool_calls';
  text: string;
  /** A tool call's fragment: its index among the calls, and its id and name on its first fragment. */
  call?: { index: number; id?: string; name?: string };
  /** vLLM's return_token_ids on a stream: the generated ids this event carries. */
  tokenIds?: number[];
}

/** Whether a piece is sent: SGLang skips empty deltas, a call's fragments always go. */
const sent = (p: Piece): boolean => p.call !== undefined || p.text !== '';

/**
 * vLLM's streamed ids (return_token_ids): each choice's generated ids spread in order over the
 * events that carry its pieces, the last share on its finish event, so that the events' ids put
 * together are the choice's.
 */
function spreadIds(pieces: Piece[], outputs: number[][]): { pieces: Piece[]; finish: number[][] } {
  const events = outputs.map((_, i) => pieces.filter((p) => p.index === i && sent(p)).length + 1);
  const share = (i: number, k: number) =>
    outputs[i].slice(Math.floor((k * outputs[i].length) / events[i]), Math.floor(((k + 1) * outputs[i].length) / events[i]));
  const seen = outputs.map(() => 0);
  return {
    pieces: pieces.map((p) => (sent(p) ? { ...p, tokenIds: share(p.index, seen[p.index]++) } : p)),
    finish: outputs.map((_, i) => share(i, events[i] - 1)),
  };
}

/** A choice's calls as SGLang streams them: each call's id and name with empty arguments, then its arguments in pieces. */
function callPieces(index: number, calls: NonNullable<Generated['toolCalls']>): Piece[] {
  return calls.flatMap((c, k) => [
    { index, field: 'tool_calls' as const, text: '', call: { index: k, id: c.id, name: c.function.name } },
    ...cut(index, 'tool_calls', c.function.arguments, Math.max(1, Math.ceil(c.function.arguments.length / CHARS_PER_TOKEN))).map((p) => ({
      ...p,
      call: { index: k },
    })),
  ]);
}

export interface ReplyPlan {
  degenerate: boolean;
  cachedTokens: number;
  /** Aborted after this share of the generation (0 gives the empty text aborts often have), or undefined. */
  abortAt: number | undefined;
  /** The first choice's ids come back one short of its usage (tokenIdMismatchRate). */
  skewIds?: boolean;
}

/** `text` cut into `tokens` pieces of about equal length (some empty when the text is shorter). */
function cut(index: number, field: Piece['field'], text: string, tokens: number): Piece[] {
  const pieces: Piece[] = [];
  for (let i = 0; i < tokens; i++) {
    pieces.push({ index, field, text: text.slice(Math.floor((i * text.length) / tokens), Math.floor(((i + 1) * text.length) / tokens)) });
  }
  return pieces;
}

/** The choices' pieces token by token side by side, as their sequences decode together. */
function interleave(lists: Piece[][]): Piece[] {
  const out: Piece[] = [];
  const longest = Math.max(0, ...lists.map((l) => l.length));
  for (let t = 0; t < longest; t++) for (const l of lists) if (t < l.length) out.push(l[t]);
  return out;
}

interface ChoiceOut {
  out: Generated;
  content: string;
  reasoning: string | null;
  /** The calls, when a tool-call parser took them out of the text (content is then empty). */
  toolCalls: Generated['toolCalls'] | null;
}

/** One choice's generation: degenerate, aborted part-way, or the prompt's answer. */
function choiceOf(request: ChatRequest, knobs: Knobs, plan: ReplyPlan, index: number): ChoiceOut {
  const degenerateChoice = plan.degenerate || (request.n > 1 && index === request.emptyChoice);
  let out = degenerateChoice ? degenerate() : generate(request, knobs, request.maxTokens, index);
  if (plan.abortAt !== undefined) {
    const share = Math.floor((out.reasoningTokens + out.contentTokens) * plan.abortAt);
    out = { ...generate(request, knobs, share, index), finishReason: 'abort' };
  }
  const text = split(out, request, knobs.reasoningParser === 1);
  if (!out.toolCalls) return { out, ...text, toolCalls: null };
  if (knobs.toolCallParser === 1) return { out, reasoning: text.reasoning, content: '', toolCalls: out.toolCalls };
  // Without a parser the calls are plain text, and the model simply stopped.
  const thinkBlock = request.thinking && knobs.reasoningParser !== 1 ? `<think>\n${out.reasoning}\n</think>\n\n` : '';
  return { out: { ...out, finishReason: 'stop' }, reasoning: text.reasoning, content: `${thinkBlock}${out.content}`, toolCalls: null };
}

/**
 * SGLang's non-streaming chat.completion body for `request`, and its pieces when it is streamed.
 * With `n` > 1 the prompt is prefilled once and n choices decoded: each its own index and
 * finish_reason, one usage summing their tokens (docs/sglang.md "The prefix cache, `n` and multi-turn history").
 */
export function buildReply(request: ChatRequest, knobs: Knobs, plan: ReplyPlan): Reply {
  const parser = knobs.reasoningParser === 1;
  const choices = Array.from({ length: request.n }, (_, i) => choiceOf(request, knobs, plan, i));
  const tokensOf = (c: ChoiceOut) => c.out.reasoningTokens + c.out.contentTokens;
  const completionTokens = choices.reduce((sum, c) => sum + tokensOf(c), 0);
  const reasoningTokens = choices.reduce((sum, c) => sum + c.out.reasoningTokens, 0);
  const cached = knobs.enableCacheReport === 1 && plan.cachedTokens > 0;
  const ids = request.promptIds
    ? replyIds(
        request.ids,
        request.promptIds,
        choices.map(({ out }) => ({ finishReason: out.finishReason, text: out.reasoning + out.content, tokens: tokensOf({ out } as ChoiceOut) })),
        plan.skewIds === true,
      )
    : null;
  // With a parser the think block streams as reasoning_content deltas; without, it is content like the rest.
  const text = !request.stream
    ? []
    : interleave(
        choices.map(({ out, content, reasoning, toolCalls }, i) =>
          toolCalls
            ? [...(reasoning === null ? [] : cut(i, 'reasoning_content', reasoning, out.reasoningTokens)), ...callPieces(i, toolCalls)]
            : reasoning === null
              ? cut(i, 'content', content, out.reasoningTokens + out.contentTokens)
              : [...cut(i, 'reasoning_content', reasoning, out.reasoningTokens), ...cut(i, 'content', content, out.contentTokens)],
        ),
      );
  const { pieces, finish } = ids?.streamed ? spreadIds(text, ids.streamed) : { pieces: text, finish: null };
  return {
    completionTokens,
    decodeTokens: Math.max(...choices.map(tokensOf)),
    finishIds: finish,
    // A step's calls are generated text: the template renders them back in the next request's prompt.
    generated: answerSequence(request.thinking && parser ? choices[0].out.reasoning : null, choices[0].toolCalls ? choices[0].out.content : choices[0].content),
    pieces,
    body: {
      // 32 hex digits, as SGLang's uuid4().hex; randomUUID draws from a cached pool, cheaper than randomBytes an id.
      id: randomUUID().replaceAll('-', ''),
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: request.model,
      choices: choices.map(({ out, content, reasoning, toolCalls }, index) => ({
        index,
        message: { role: 'assistant', content: toolCalls ? null : content, reasoning_content: reasoning, tool_calls: toolCalls },
        logprobs: request.logprobs
          ? tokenLogprobs(
              out.reasoning + out.content,
              out.reasoningTokens + out.contentTokens,
              request.topLogprobs,
              seededRandom(hashSeed(index === 0 ? `${request.digest}:logprobs` : `${request.digest}:logprobs:${index}`)),
            )
          : null,
        finish_reason: out.finishReason,
        matched_stop: out.finishReason === 'stop' ? EOS_TOKEN_ID : null,
        ...ids?.perChoice[index],
      })),
      usage: {
        prompt_tokens: request.promptTokens,
        completion_tokens: completionTokens,
        total_tokens: request.promptTokens + completionTokens,
        reasoning_tokens: parser ? reasoningTokens : 0,
        prompt_tokens_details: cached ? { cached_tokens: plan.cachedTokens } : null,
      },
      metadata: { weight_version: WEIGHT_VERSION },
      ...(ids?.sglext && { sglext: ids.sglext }),
      ...(ids?.rootPrompt && { prompt_token_ids: ids.rootPrompt }),
    },
  };
}

// ---- streaming (serving_chat.py _generate_chat_stream) ----

interface ReplyBody {
  id: string;
  created: number;
  model: string;
  choices: { finish_reason: string; matched_stop: number | null }[];
  usage: object;
  sglext?: object;
  prompt_token_ids?: number[];
}

function chunk(body: ReplyBody, choices: object[], usage: object | null = null, extra: object = {}): string {
  return `data: ${JSON.stringify({ id: body.id, object: 'chat.completion.chunk', created: body.created, model: body.model, choices, usage, ...extra })}\n\n`;
}

/** A choice's event with the ids it carries (vLLM's return_token_ids), when it carries any. */
const withIds = (choice: object, ids: number[] | undefined) => (ids ? { ...choice, token_ids: ids } : choice);

const delta = (d: object, finish: { finish_reason: string; matched_stop: number | null } | null = null, index = 0) => ({
  index,
  delta: { role: null, content: null, reasoning_content: null, tool_calls: null, ...d },
  logprobs: null,
  finish_reason: finish?.finish_reason ?? null,
  matched_stop: finish?.matched_stop ?? null,
});

/** The first event: the assistant role with empty content, and vLLM's prompt ids when asked. */
export function streamHead(reply: Reply): string {
  const body = reply.body as ReplyBody;
  return chunk(body, [delta({ role: 'assistant', content: '' })], null, body.prompt_token_ids ? { prompt_token_ids: body.prompt_token_ids } : {});
}

const eventHeads = new WeakMap<Reply, string>();

/**
 * What every event of a reply begins with, up to its choices: the same text chunk() writes there,
 * made once a reply rather than once a token (a streamed answer's events were the simulator's
 * largest cost in the test suite). A reply's body is not changed once built.
 */
function eventHead(reply: Reply): string {
  let head = eventHeads.get(reply);
  if (head === undefined) {
    const { id, created, model } = reply.body as ReplyBody;
    head = `data: {"id":${JSON.stringify(id)},"object":"chat.completion.chunk","created":${JSON.stringify(created)},"model":${JSON.stringify(model)},"choices":[`;
    eventHeads.set(reply, head);
  }
  return head;
}

/** One token's event; an empty piece sends nothing, as SGLang skips empty deltas. */
export function streamPiece(reply: Reply, piece: Piece): string {
  if (piece.call) {
    const { index, id, name } = piece.call;
    const call = { index, ...(id && { id, type: 'function' }), function: { ...(name && { name }), arguments: piece.text } };
    return chunk(reply.body as ReplyBody, [withIds(delta({ tool_calls: [call] }, null, piece.index), piece.tokenIds)]);
  }
  if (piece.text === '') return '';
  // Every call's fragment has its call (callPieces); should one come without, it is written as before.
  if (piece.field === 'tool_calls') return chunk(reply.body as ReplyBody, [withIds(delta({ tool_calls: piece.text }, null, piece.index), piece.tokenIds)]);
  // The text chunk(delta(...)) writes for a piece of content or reasoning, key for key
  // (test/unit/sim-stream-events.test.ts holds the two together).
  const text = JSON.stringify(piece.text);
  const content = piece.field === 'content' ? text : 'null';
  const reasoning = piece.field === 'reasoning_content' ? text : 'null';
  const ids = piece.tokenIds ? `,"token_ids":${JSON.stringify(piece.tokenIds)}` : '';
  return `${eventHead(reply)}{"index":${piece.index},"delta":{"role":null,"content":${content},"reasoning_content":${reasoning},"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null${ids}}],"usage":null}\n\n`;
}

/**
 * The finish event of each choice, the usage event with empty choices when asked for, the sglext
 * ids in a last event with empty choices when asked for, and `data: [DONE]`.
 */
export function streamTail(reply: Reply, includeUsage: boolean): string {
  const body = reply.body as ReplyBody;
  const finish = body.choices.map((c, i) => chunk(body, [withIds(delta({}, c, i), reply.finishIds?.[i])])).join('');
  const ids = body.sglext
    ? `data: ${JSON.stringify({ id: body.id, object: 'chat.completion.chunk', created: body.created, model: body.model, choices: [], usage: null, sglext: body.sglext })}\n\n`
    : '';
  return `${finish}${includeUsage ? chunk(body, [], body.usage) : ''}${ids}data: [DONE]\n\n`;
}
