import { holdsNumber, losesNumbers, mayLoseNumbers, objectMembers, objectText } from './exact-json.js';
import { readableIssues } from './issues.js';
import { MAX_JSON_DEPTH, nestsDeeperThan } from './json-depth.js';
import { Params } from './params.js';
import type { RegenerateMode } from './run-settings.js';
import { fieldPath, findBadText, mayHoldBadText, textProblem } from './text.js';
import { requestCount } from './conversation.js';
import { callsOf, sharegptCalls } from './tools.js';
import { DEFAULT_RUN_ENDPOINT, type RunEndpoint } from './run-endpoint.js';
import { rawRequestOf, type RawRequest } from './raw-request.js';

// One input line → one sample (docs/design.md "Input"). Every reason returned here is shown to
// users next to the line number, so it names the field path and says what was expected.

export type ChatMessage = { role: string; content: unknown; [k: string]: unknown };

/**
 * Why a line was refused, as a client can act on it; OpenAI's batch errors use the same codes.
 * Each has the request field at fault, when there is one.
 */
export const LINE_ERROR_PARAMS = {
  invalid_json_line: null,
  invalid_request: null,
  duplicate_custom_id: 'custom_id',
  mismatched_model: 'body.model',
  /** A batch line whose `url` is not the batch's `endpoint`. */
  mismatched_endpoint: 'url',
  model_not_found: 'body.model',
  invalid_role: 'body.messages',
  /** `regenerate: "all_assistant"` cannot walk the line turn by turn (a tool result without its call, an assistant turn first). */
  unwalkable_conversation: 'body.messages',
  /** A NUL or an unpaired surrogate in a string: accepted by JSON.parse, refused by the stores and most readers (`text.ts`). */
  invalid_characters: null,
  /** The line's own fields (kept as the output line's `metadata`) are over MAX_METADATA_BYTES. */
  metadata_too_large: null,
} as const satisfies Record<string, string | null>;
export type LineErrorCode = keyof typeof LINE_ERROR_PARAMS;

/** A refused input line as a run keeps it (the first 100 of a run are kept). */
export interface InvalidLine {
  line: number;
  message: string;
  custom_id?: string;
  /** Absent on lines refused before codes were stored: read as invalid_request. */
  code?: LineErrorCode;
}

export type ParsedLine =
  | {
      ok: true;
      custom_id: string;
      messages: ChatMessage[];
      params: Record<string, unknown> | null;
      model: string | null;
      /** Characters of the assistant turns `regenerate` dropped (their reasoning too): what predicts the new answers' length. */
      old_answer_chars: number | null;
      /** The line's fields regen does not read (a `source`, a `meta` object), kept for the output line; null when there are none. */
      metadata: Record<string, unknown> | null;
      /**
       * The same fields as the line wrote them, each its JSON text: only on a line with a number
       * that parsing changes (past 2^53, -0, 1e400), which the output then writes as written.
       */
      exact_metadata?: Record<string, string>;
      /** `all_assistant` only: the requests to ask as the source took them, one a user turn and one a tool-call step. */
      turns?: number;
      /** A completions or embeddings run's line: its raw prompt or input (its `messages` are then empty). */
      raw?: RawRequest;
      /** The line's id (its custom_id) was a JSON number: SpecForge's format writes it back as one. */
      numeric_id?: true;
    }
  | {
      ok: false;
      reason: string;
      code: LineErrorCode;
      /** The line's own id, when it had a usable one. */
      custom_id?: string;
    };

export interface ParseOptions {
  regenerate: RegenerateMode | null;
  /**
   * An OpenAI batch's lines may ask `n` choices in their body: OpenAI's shape, one sample whose
   * answer holds the n choices (a run's lines may not: its `params.n` makes samples of them).
   */
  choicesInBody?: boolean;
  /** The run's endpoint: what a line's request is (chat messages when absent). */
  endpoint?: RunEndpoint;
}

type JsonObject = Record<string, unknown>;

/** A line's content, before the run's options are applied. */
interface LineContent {
  custom_id: string;
  messages: ChatMessage[];
  params: JsonObject | null;
  model: string | null;
  raw?: RawRequest;
}

/** Thrown inside this module only, to stop at the first problem; parseInputLine returns it. */
class LineRejected extends Error {
  constructor(
    message: string,
    readonly code: LineErrorCode = 'invalid_request',
  ) {
    super(message);
  }
}

const MAX_CUSTOM_ID_CHARS = 512;
// C0, DEL and C1: invisible in logs and listings, and they break the ids users grep for.
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const CONTROL_CHARS = /[\u0000-\u001f\u007f-\u009f]/;
const MAX_JSON_MESSAGE_CHARS = 120;

/**
 * OpenAI's chat roles, the ones chat templates render. Qwen3's template, for one, silently drops a
 * turn of any other role, so a "human" turn would vanish from the prompt instead of failing.
 */
export const CHAT_ROLES = ['system', 'developer', 'user', 'assistant', 'tool'] as const;

/** Role names other APIs and dataset formats use, and the chat role each stands for: the fix a refusal offers. */
const ROLE_SYNONYMS: Record<string, string> = {
  human: 'user',
  gpt: 'assistant',
  bot: 'assistant',
  // Gemini's name for the assistant.
  model: 'assistant',
  // OpenAI's deprecated role for a function's result.
  function: 'tool',
  observation: 'tool',
};

/**
 * ShareGPT's `from` values as chat roles: the format's own human/gpt, the chat roles, and
 * LLaMA-Factory's ShareGPT variant's `observation` (a tool's result).
 */
const SHAREGPT_ROLES: Record<string, string> = {
  system: 'system',
  human: 'user',
  user: 'user',
  gpt: 'assistant',
  assistant: 'assistant',
  tool: 'tool',
  observation: 'tool',
  // LLaMA-Factory: the assistant's call, as the JSON text of one call or a list of them.
  function_call: 'assistant',
};

export function parseInputLine(text: string, lineNo: number, opts: ParseOptions): ParsedLine {
  let obj: JsonObject | undefined;
  let exact: Map<string, string> | null = null;
  try {
    const line = text.endsWith('\r') ? text.slice(0, -1) : text;
    obj = parseJsonObject(line);
    checkStorable(obj, text);
    const consumed = consumedFields(opts.endpoint);
    exact = exactMembers(obj, line, consumed);
    const content = readLine(obj, lineNo, opts, exact);
    if (content.raw) return { ok: true, ...content, old_answer_chars: null, ...readMetadata(obj, exact, consumed) };
    if (opts.regenerate === 'all_assistant') {
      const messages = walkConversation(content.messages);
      const dropped = content.messages.filter((m) => m.role === 'assistant');
      const old = dropped.reduce((n, m) => n + textLength(m.content) + textLength(m.reasoning_content), 0);
      const turns = requestCount(messages);
      return { ok: true, ...content, messages, old_answer_chars: dropped.length ? old : null, ...readMetadata(obj, exact, consumed), turns, ...numericId(obj) };
    }
    const messages = applyRegenerate(content.messages, opts);
    const dropped = messages === content.messages ? null : content.messages[content.messages.length - 1];
    return {
      ok: true,
      ...content,
      messages,
      old_answer_chars: dropped ? textLength(dropped.content) + textLength(dropped.reasoning_content) : null,
      ...readMetadata(obj, exact, consumed),
      ...numericId(obj),
    };
  } catch (err) {
    if (!(err instanceof LineRejected)) throw err;
    const custom_id = obj && ownCustomId(obj, lineNo, exact);
    return { ok: false, reason: err.message, code: err.code, ...(custom_id ? { custom_id } : {}) };
  }
}

/** The fields of a line that regen reads itself, in any of its formats: the rest are the line's metadata. */
const CHAT_FIELDS = ['custom_id', 'id', 'messages', 'conversations', 'prompt', 'params', 'body', 'method', 'url', 'tools', 'tool_choice'];
const CONSUMED_FIELDS = new Set(CHAT_FIELDS);
/** An embeddings line's `input` is its request; anywhere else (Alpaca's instruction/input/output, say) it is the line's own field. */
const EMBEDDINGS_CONSUMED_FIELDS = new Set([...CHAT_FIELDS, 'input']);
const consumedFields = (endpoint: RunEndpoint | undefined) => (endpoint === '/v1/embeddings' ? EMBEDDINGS_CONSUMED_FIELDS : CONSUMED_FIELDS);
/**
 * The line's members as it wrote them, when its numeric id or its own fields hold a number that
 * parsing changed; else null. A line whose id is a string and whose own fields hold no number (the
 * common line) costs one look at its keys, one whose numbers have none of the shapes of a changed
 * number one regular expression.
 */
function exactMembers(obj: JsonObject, line: string, consumed: ReadonlySet<string>): Map<string, string> | null {
  const written = Object.keys(obj).filter((key) => !consumed.has(key) && holdsNumber(obj[key]));
  if (typeof obj.id === 'number' && (obj.custom_id ?? null) === null) written.push('id');
  if (written.length === 0 || !mayLoseNumbers(line)) return null;
  const members = objectMembers(line);
  return written.some((key) => losesNumbers(members.get(key) ?? '')) ? members : null;
}

/** At most this many bytes of a line's own fields (as JSON) are kept: they ride on every output line. */
export const MAX_METADATA_BYTES = 64 * 1024;

/**
 * The line's fields regen does not consume (null when it has none), and their source text when the
 * line holds numbers parsing changes (`exact`); refused past MAX_METADATA_BYTES.
 */
function readMetadata(
  obj: JsonObject,
  exact: Map<string, string> | null,
  consumed: ReadonlySet<string>,
): { metadata: JsonObject | null; exact_metadata?: Record<string, string> } {
  let metadata: JsonObject | null = null;
  for (const key of Object.keys(obj)) {
    if (consumed.has(key)) continue;
    metadata ??= {};
    // An assignment to `__proto__` would set the prototype: the field would vanish.
    if (key === '__proto__') Object.defineProperty(metadata, key, { value: obj[key], enumerable: true, writable: true, configurable: true });
    else metadata[key] = obj[key];
  }
  if (!metadata) return { metadata };
  const exact_metadata = exact ? Object.fromEntries(Object.keys(metadata).map((key) => [key, exact.get(key) as string])) : undefined;
  const bytes = Buffer.byteLength(exact_metadata ? objectText(exact_metadata) : JSON.stringify(metadata));
  if (bytes > MAX_METADATA_BYTES) {
    throw new LineRejected(
      `the line's own fields (${Object.keys(metadata).join(', ').slice(0, 200)}), kept as the output's metadata, are over ${MAX_METADATA_BYTES} bytes as JSON`,
      'metadata_too_large',
    );
  }
  return exact_metadata ? { metadata, exact_metadata } : { metadata };
}

/** Marks a line whose custom_id is its numeric `id`, written as it was. */
const numericId = (obj: JsonObject): { numeric_id?: true } => ((obj.custom_id ?? null) === null && typeof obj.id === 'number' ? { numeric_id: true } : {});

/** The id a refused line gave itself, so that its error can be matched to it; none when it is the fault. */
function ownCustomId(obj: JsonObject, lineNo: number, exact: Map<string, string> | null): string | undefined {
  if ((obj.custom_id ?? obj.id ?? null) === null) return undefined;
  try {
    return readCustomId(obj, lineNo, exact);
  } catch {
    return undefined;
  }
}

function parseJsonObject(line: string): JsonObject {
  if (line.trim() === '') throw new LineRejected('empty line', 'invalid_json_line');
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch (err) {
    throw new LineRejected(`not valid JSON: ${jsonErrorMessage(err)}`, 'invalid_json_line');
  }
  if (!isObject(value)) throw new LineRejected('line is not a JSON object', 'invalid_json_line');
  return value;
}

/** Parsed fine, but the sample could never be stored or sent. */
function checkStorable(obj: JsonObject, text: string): void {
  // JSON.stringify would overflow.
  if (nestsDeeperThan(obj)) throw new LineRejected(`line is nested more than ${MAX_JSON_DEPTH} levels deep`);
  const bad = mayHoldBadText(text) ? findBadText(obj) : null;
  if (bad) throw new LineRejected(`${fieldPath(bad.path) || 'line'}: ${bad.message}`, 'invalid_characters');
}

function jsonErrorMessage(err: unknown): string {
  // Engines differ on how deep nesting may go; the ones that give up throw RangeError.
  if (err instanceof RangeError) return 'nesting too deep';
  const message = err instanceof Error ? err.message : String(err);
  return message.length > MAX_JSON_MESSAGE_CHARS ? `${message.slice(0, MAX_JSON_MESSAGE_CHARS)}…` : message;
}

function readLine(obj: JsonObject, lineNo: number, opts: ParseOptions, exact: Map<string, string> | null): LineContent {
  const custom_id = readCustomId(obj, lineNo, exact);
  const endpoint = opts.endpoint ?? DEFAULT_RUN_ENDPOINT;
  if (obj.body !== undefined) checkUrl(obj, endpoint);
  if (endpoint !== '/v1/chat/completions') {
    const { body } = obj;
    if (body !== undefined && !isObject(body)) throw new LineRejected('body must be an object');
    const read = rawRequestOf(endpoint, body ?? obj, body === undefined ? '' : 'body.');
    if ('error' in read) throw new LineRejected(read.error);
    const own = body === undefined ? readParams(obj) : read.rest;
    return { custom_id, messages: [], raw: read.raw, ...splitModel(own, body === undefined ? 'params' : 'body', opts.choicesInBody === true) };
  }
  if (obj.messages !== undefined) {
    return { custom_id, messages: readMessages(obj.messages, 'messages', opts.regenerate), ...splitModel(readParams(obj), 'params') };
  }
  if (obj.body !== undefined) {
    if (obj.tools !== undefined) throw new LineRejected('tools: an OpenAI batch line carries its tools inside body, as body.tools');
    return { custom_id, ...readBatchRequest(obj, opts) };
  }
  if (obj.conversations !== undefined) {
    return { custom_id, messages: readConversations(obj.conversations, opts.regenerate, lineNo), ...splitModel(readParams(obj), 'params') };
  }
  if (obj.prompt !== undefined) {
    return { custom_id, messages: [readPrompt(obj.prompt)], ...splitModel(readParams(obj), 'params') };
  }
  throw new LineRejected('no messages: expected "messages", "body.messages", "conversations" or "prompt"');
}

/** `exact`: the line's members as written, when it holds numbers parsing changes (a numeric id is then its literal). */
function readCustomId(obj: JsonObject, lineNo: number, exact: Map<string, string> | null): string {
  if (obj.custom_id !== undefined && obj.custom_id !== null) {
    if (typeof obj.custom_id !== 'string') throw new LineRejected('custom_id must be a string');
    return checkId(obj.custom_id, 'custom_id');
  }
  if (obj.id !== undefined && obj.id !== null) {
    // Dataset ids are often row numbers: the id is the number as written, so 9007199254740993 is not
    // 9007199254740992, nor -0 the same as 0 (a line without such numbers writes them back as they were).
    const literal = typeof obj.id === 'number' ? exact?.get('id') : undefined;
    if (literal !== undefined) return checkId(literal, 'id');
    if (typeof obj.id === 'number' && Number.isFinite(obj.id)) return String(obj.id);
    if (typeof obj.id !== 'string') throw new LineRejected('id must be a string or a number');
    return checkId(obj.id, 'id');
  }
  return `line-${lineNo}`;
}

function checkId(id: string, field: string): string {
  if (id === '') throw new LineRejected(`${field} must not be empty`);
  if (id.length > MAX_CUSTOM_ID_CHARS) throw new LineRejected(`${field} is longer than ${MAX_CUSTOM_ID_CHARS} characters`);
  if (CONTROL_CHARS.test(id)) throw new LineRejected(`${field} must not contain control characters`);
  // A line with such an id is refused whole (`checkStorable`); this keeps the id out of its error too.
  const bad = textProblem(id);
  if (bad) throw new LineRejected(`${field} ${bad}`, 'invalid_characters');
  return id;
}

/** The line's params, with its top-level `tools` and `tool_choice` (the line's own win over its params' and the run's). */
function readParams(obj: JsonObject): JsonObject | null {
  if (obj.params !== undefined && obj.params !== null && !isObject(obj.params)) throw new LineRejected('params must be an object');
  const params = (obj.params ?? null) as JsonObject | null;
  const tools = readTools(obj.tools);
  if (tools === undefined && obj.tool_choice === undefined) return params;
  return { ...params, ...(tools !== undefined && { tools }), ...(obj.tool_choice !== undefined && { tool_choice: obj.tool_choice }) };
}

/** A line's `tools`: OpenAI's function definitions, or their JSON text as LLaMA-Factory's ShareGPT lines write them. */
function readTools(value: unknown): unknown {
  if (value === undefined || value === null || value === '') return undefined;
  if (typeof value !== 'string') return value;
  try {
    return JSON.parse(value);
  } catch {
    throw new LineRejected('tools: a string must be the JSON text of a list of function definitions');
  }
}

/**
 * The model is a field of its own in every format, so it is never sent twice or overridden
 * blindly; params with nothing else left are null, as if the line had none.
 */
function splitModel(params: JsonObject | null, path: string, choicesInBody = false): { params: JsonObject | null; model: string | null } {
  if (params === null) return { params: null, model: null };
  const { model = null, ...rest } = params;
  if (model !== null && typeof model !== 'string') throw new LineRejected(`${path}.model must be a string`);
  return { params: Object.keys(rest).length > 0 ? checkParams(rest, path, choicesInBody) : null, model };
}

/**
 * A line's params override the run's when sent, so they obey the same rules: a `stream: true` or
 * an `n: 4` (a run's setting only) would otherwise reach the server and its extra answers be lost.
 */
function checkParams(params: JsonObject, path: string, choicesInBody = false): JsonObject {
  // n is the run's: its answers become samples of their own, which a line cannot add (a batch's line keeps them in one answer).
  if (!choicesInBody && params.n !== undefined && params.n !== 1)
    throw new LineRejected(`${path}.n: n > 1 is a run's setting (params.n on the run), not a line's`);
  const checked = Params.safeParse(params);
  if (checked.success) return checked.data;
  const issue = readableIssues(checked.error.issues)[0];
  const where = issue.path.map((p) => (typeof p === 'number' ? `[${p}]` : `.${String(p)}`)).join('');
  throw new LineRejected(`${path}${where}: ${issue.message}`);
}

/** An OpenAI batch line's method and url: a url other than the run's endpoint is the line's error, as OpenAI's. */
function checkUrl(obj: JsonObject, endpoint: RunEndpoint): void {
  if (obj.method !== 'POST') throw new LineRejected('method must be "POST"');
  if (typeof obj.url !== 'string') throw new LineRejected(`url must be a string: the batch's endpoint, "${endpoint}"`);
  if (obj.url !== endpoint)
    throw new LineRejected(`url ${JSON.stringify(obj.url.slice(0, 100))} differs from the batch's endpoint "${endpoint}"`, 'mismatched_endpoint');
}

function readBatchRequest(obj: JsonObject, opts: ParseOptions): Omit<LineContent, 'custom_id'> {
  if (!isObject(obj.body)) throw new LineRejected('body must be an object');
  const { messages, ...rest } = obj.body;
  return { messages: readMessages(messages, 'body.messages', opts.regenerate), ...splitModel(rest, 'body', opts.choicesInBody === true) };
}

/** Whether the turn at `i` of `count` is one `regenerate` drops (if it is an assistant's): its content is never sent. */
function dropped(regenerate: RegenerateMode | null, i: number, count: number): boolean {
  return regenerate === 'all_assistant' || (regenerate === 'last_assistant' && i === count - 1);
}

function readMessages(value: unknown, path: string, regenerate: RegenerateMode | null): ChatMessage[] {
  if (!Array.isArray(value) || value.length === 0) throw new LineRejected(`${path} must be a non-empty array`);
  for (const [i, message] of value.entries()) checkMessage(message, `${path}[${i}]`, dropped(regenerate, i, value.length));
  return value as ChatMessage[];
}

function checkMessage(message: unknown, path: string, droppedIfAssistant: boolean): void {
  if (!isObject(message)) throw new LineRejected(`${path} must be an object`);
  if (typeof message.role !== 'string') throw new LineRejected(`${path}.role must be a string`);
  if (!(CHAT_ROLES as readonly string[]).includes(message.role)) throw new LineRejected(unknownRole(message.role, path), 'invalid_role');
  if (message.tool_calls !== undefined && message.tool_calls !== null) checkToolCalls(message, path);
  if (message.role === 'tool' && message.tool_call_id !== undefined && typeof message.tool_call_id !== 'string') {
    throw new LineRejected(`${path}.tool_call_id must be a string`);
  }
  const { content } = message;
  // The OpenAI API allows an assistant turn that only calls tools to have no content; one that is
  // dropped to be asked again is never sent, so what it held does not matter.
  if (content === null && message.role === 'assistant' && (Array.isArray(message.tool_calls) || droppedIfAssistant)) return;
  if (typeof content === 'string') return;
  if (!Array.isArray(content)) throw new LineRejected(`${path}.content must be a string or an array of content parts`);
  content.forEach((part, i) => {
    if (!isObject(part) || typeof part.type !== 'string') {
      throw new LineRejected(`${path}.content[${i}] must be a content part: an object with a string "type"`);
    }
  });
}

/** An assistant message's `tool_calls`, as OpenAI's API has them: each an id, "function", a name and its arguments' JSON text. */
function checkToolCalls(message: JsonObject, path: string): void {
  if (message.role !== 'assistant') throw new LineRejected(`${path}.tool_calls: only an assistant message calls tools`);
  if (!Array.isArray(message.tool_calls)) throw new LineRejected(`${path}.tool_calls must be an array of calls`);
  message.tool_calls.forEach((call, i) => {
    const at = `${path}.tool_calls[${i}]`;
    if (!isObject(call) || !isObject(call.function))
      throw new LineRejected(`${at} must be a call: {"id", "type": "function", "function": {"name", "arguments"}}`);
    if (typeof call.function.name !== 'string' || call.function.name === '') throw new LineRejected(`${at}.function.name must be a non-empty string`);
    if (typeof call.function.arguments !== 'string') throw new LineRejected(`${at}.function.arguments must be a string (the arguments' JSON text)`);
    if (call.id !== undefined && typeof call.id !== 'string') throw new LineRejected(`${at}.id must be a string`);
  });
}

function unknownRole(role: string, path: string): string {
  const synonym = ROLE_SYNONYMS[role.toLowerCase()];
  const fix = synonym ? `write "${synonym}"` : `use one of ${CHAT_ROLES.map((r) => `"${r}"`).join(', ')}`;
  return `${path}.role ${JSON.stringify(role.slice(0, 64))} is not a chat role: ${fix}`;
}

/**
 * `conversations` in either shape datasets use: ShareGPT's `from`/`value` (human/gpt/system), or
 * `role`/`content` as SpecForge reads and writes it (its other fields kept, as in `messages`).
 */
function readConversations(value: unknown, regenerate: RegenerateMode | null, lineNo: number): ChatMessage[] {
  if (!Array.isArray(value) || value.length === 0) throw new LineRejected('conversations must be a non-empty array');
  // ShareGPT's calls have no ids: regen makes them, and each observation answers the next call not yet answered.
  let callsMade = 0;
  const unanswered: string[] = [];
  return value.map((turn, i) => {
    const path = `conversations[${i}]`;
    if (!isObject(turn)) throw new LineRejected(`${path} must be an object`);
    if (turn.from === undefined && turn.role !== undefined) {
      checkMessage(turn, path, dropped(regenerate, i, value.length));
      return turn as ChatMessage;
    }
    if (typeof turn.from !== 'string') throw new LineRejected(`${path}.from must be a string`);
    const role = SHAREGPT_ROLES[turn.from];
    if (role === undefined) {
      const known = Object.keys(SHAREGPT_ROLES)
        .map((r) => `"${r}"`)
        .join(', ');
      throw new LineRejected(`${path}.from ${JSON.stringify(turn.from.slice(0, 64))} is not a ShareGPT role: use one of ${known}`, 'invalid_role');
    }
    if (typeof turn.value !== 'string') throw new LineRejected(`${path}.value must be a string`);
    if (turn.from === 'function_call') {
      let calls: ReturnType<typeof sharegptCalls>;
      try {
        calls = sharegptCalls(turn.value, lineNo, callsMade);
      } catch (err) {
        throw new LineRejected(`${path}.value: ${(err as Error).message}`);
      }
      callsMade += calls.length;
      unanswered.splice(0, unanswered.length, ...calls.map((c) => c.id));
      return { role, content: null, tool_calls: calls };
    }
    if (role === 'tool') {
      // One that answers no call stays a bare tool turn, as it always was; the walk refuses it (walkConversation).
      const id = unanswered.shift();
      return id === undefined ? { role, content: turn.value } : { role, content: turn.value, tool_call_id: id };
    }
    return { role, content: turn.value };
  });
}

/** Roles a conversation may hold when walked turn by turn: the instructions, and the turns themselves. */
const WALKED_ROLES = new Set(['system', 'developer', 'user']);

/**
 * `all_assistant`: the conversation without its assistant text answers, each user turn to be
 * answered in order. The source's tool-call steps are kept (the assistant message's calls and the
 * `tool` messages answering them): their results are paired with the target's calls
 * (domain/conversation.ts). A line whose tool results answer no call, or that does not start with
 * the user, is refused: its regenerated turns would not follow.
 */
function walkConversation(messages: ChatMessage[]): ChatMessage[] {
  const walked: ChatMessage[] = [];
  let inStep = false;
  for (const [i, m] of messages.entries()) {
    const why = (reason: string) =>
      new LineRejected(`message ${i} (${m.role}) ${reason}: regenerate "all_assistant" cannot walk this conversation`, 'unwalkable_conversation');
    if (m.function_call !== undefined) throw why('uses the deprecated function_call: write it as tool_calls');
    if (m.role === 'tool') {
      if (!inStep) throw why('is a tool result that answers no tool call before it');
      walked.push(m);
      continue;
    }
    inStep = false;
    if (m.role === 'assistant') {
      if (!walked.some((w) => w.role === 'user')) throw why('comes before any user turn');
      const calls = callsOf(m);
      if (calls) {
        // Only the calls are read (their names and ids pair the results): the source's words are not sent.
        walked.push({ role: 'assistant', content: null, tool_calls: calls });
        inStep = true;
      }
      continue;
    }
    if (!WALKED_ROLES.has(m.role)) throw why('has a role that is not system, user, assistant or tool');
    walked.push(m);
  }
  if (!walked.some((m) => m.role === 'user')) throw new LineRejected('the conversation has no user turn to answer', 'unwalkable_conversation');
  return walked;
}

function readPrompt(value: unknown): ChatMessage {
  if (typeof value !== 'string' || value.trim() === '') throw new LineRejected('prompt must be a non-empty string');
  return { role: 'user', content: value };
}

function applyRegenerate(messages: ChatMessage[], opts: ParseOptions): ChatMessage[] {
  if (opts.regenerate !== 'last_assistant' || messages[messages.length - 1].role !== 'assistant') return messages;
  if (messages.length === 1) throw new LineRejected('nothing left to send after dropping the last assistant turn');
  return messages.slice(0, -1);
}

/** The characters of a message's text: a string, or the text parts of a content array. */
function textLength(content: unknown): number {
  if (typeof content === 'string') return content.length;
  if (!Array.isArray(content)) return 0;
  let n = 0;
  for (const part of content) if (isObject(part) && typeof part.text === 'string') n += part.text.length;
  return n;
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

// ---------------------------------------------------------------------------------------
// Reading lines from a stream. Inputs can be gigabytes, so nothing here holds more than
// one line (at most maxLineBytes) plus the chunk being scanned and the lines decoded from it.

/** A line's text, or why it could not be read as text (always an invalid_json_line). */
export type RawLine = { lineNo: number; text: string } | { lineNo: number; error: string };

export interface ReadLinesOptions {
  maxLineBytes: number;
}

const NEWLINE = 0x0a;
const BOM = '\ufeff';

/**
 * Splits a byte stream into lines numbered from 1, decoded as strict UTF-8. A line over
 * maxLineBytes is reported once and its remaining bytes are skipped, not buffered.
 */
export async function* readLines(source: AsyncIterable<Uint8Array>, opts: ReadLinesOptions): AsyncGenerator<RawLine> {
  for await (const lines of readLineBatches(source, opts)) yield* lines;
}

/**
 * readLines a chunk at a time: the lines each chunk of the source completes, as one array. A step of
 * an async generator is a promise and a turn of the microtask queue; ingest, reading hundreds of
 * thousands of lines, takes one a chunk (~64 KiB) instead of one a line.
 */
export async function* readLineBatches(source: AsyncIterable<Uint8Array>, opts: ReadLinesOptions): AsyncGenerator<RawLine[]> {
  // ignoreBOM keeps a BOM in the text: only one at the very start of the input is dropped.
  const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
  const decode = (bytes: Uint8Array, lineNo: number): RawLine => {
    try {
      const text = decoder.decode(bytes);
      return { lineNo, text: lineNo === 1 && text.startsWith(BOM) ? text.slice(1) : text };
    } catch {
      return { lineNo, error: 'not valid UTF-8' };
    }
  };
  const tooLong = (lineNo: number): RawLine => ({ lineNo, error: `line is longer than ${opts.maxLineBytes} bytes` });

  let lineNo = 1;
  // The start of the current line, when it began in an earlier chunk.
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  // Set once the current line has been reported as too long, until its newline.
  let skipping = false;

  for await (const chunk of source) {
    const buf = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    const lines: RawLine[] = [];
    let start = 0;
    for (let nl = buf.indexOf(NEWLINE, start); nl !== -1; nl = buf.indexOf(NEWLINE, start)) {
      const piece = buf.subarray(start, nl);
      start = nl + 1;
      if (skipping) {
        skipping = false;
      } else if (pendingBytes + piece.length > opts.maxLineBytes) {
        lines.push(tooLong(lineNo));
      } else if (pending.length === 0) {
        lines.push(decode(piece, lineNo));
      } else {
        pending.push(piece);
        lines.push(decode(Buffer.concat(pending, pendingBytes + piece.length), lineNo));
      }
      pending = [];
      pendingBytes = 0;
      lineNo++;
    }
    if (!skipping && start < buf.length) {
      const rest = buf.subarray(start);
      if (pendingBytes + rest.length > opts.maxLineBytes) {
        lines.push(tooLong(lineNo));
        pending = [];
        pendingBytes = 0;
        skipping = true;
      } else {
        // Copied: the source may reuse its chunk, and a short tail should not pin a large one.
        pending.push(Buffer.from(rest));
        pendingBytes += rest.length;
      }
    }
    if (lines.length) yield lines;
  }
  if (pendingBytes > 0) yield [decode(Buffer.concat(pending, pendingBytes), lineNo)];
}

/** A refused input line as OpenAI's BatchError. */
export function batchLineError(e: InvalidLine): { code: LineErrorCode; line: number; message: string; param: string | null } {
  const code = e.code ?? 'invalid_request';
  return { code, line: e.line, message: e.message, param: LINE_ERROR_PARAMS[code] };
}
