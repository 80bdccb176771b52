// Tool calls (README "Agentic conversations"): their shape as OpenAI's Chat Completions API and
// SGLang's parsers give them, what is wrong with one, and which of the source's results answers a
// target's call. Pure.

/** One call of an assistant message's `tool_calls`. */
export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/** A message of a conversation, as far as this module reads it. */
export type ToolMessage = { role: string; content?: unknown; tool_calls?: unknown; tool_call_id?: unknown; [k: string]: unknown };

/** The names of the functions a request offers (its `tools`), or null when it offers none. */
export function toolNames(tools: unknown): Set<string> | null {
  if (!Array.isArray(tools) || tools.length === 0) return null;
  const names = new Set<string>();
  for (const t of tools) {
    const name = (t as { function?: { name?: unknown } } | null)?.function?.name;
    if (typeof name === 'string') names.add(name);
  }
  return names;
}

/** A message's tool calls as regen keeps them, or null when it has none. */
export function callsOf(m: object): ToolCall[] | null {
  const calls = (m as { tool_calls?: unknown }).tool_calls;
  return Array.isArray(calls) && calls.length > 0 ? (calls as ToolCall[]) : null;
}

/** Whether a call's arguments are the JSON text of an object, as every function's parameters are. */
export function argumentsValid(args: unknown): boolean {
  if (typeof args !== 'string') return false;
  try {
    const value: unknown = JSON.parse(args);
    return typeof value === 'object' && value !== null && !Array.isArray(value);
  } catch {
    return false;
  }
}

// A parser-less server writes the calls into content as its template spells them: Qwen's and
// Hermes' <tool_call> tags, Mistral's [TOOL_CALLS], Llama 3's <|python_tag|>, DeepSeek's and
// Kimi's section markers, GLM's <tool_call>, or a bare JSON object naming a function.
const CALL_MARKUP = /<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>|<｜tool▁calls▁begin｜>|<\|tool_calls_section_begin\|>|<function=/;
const BARE_CALL = /^\s*(?:```(?:json)?\s*)?[[{]\s*\{?\s*"name"\s*:\s*"[^"]+"\s*,\s*"(?:arguments|parameters)"\s*:/;

/** Whether an answer's content holds tool-call markup instead of `tool_calls`: the server runs without a tool-call parser. */
export function callMarkupIn(content: string | null): boolean {
  return content !== null && (CALL_MARKUP.test(content) || BARE_CALL.test(content));
}

/**
 * SGLang's `--tool-call-parser` for the model's family (SGLang's function_call parsers), by its
 * name: what the gate's words tell an operator to launch the server with.
 */
export function toolCallParser(model: string): string {
  const m = model.toLowerCase();
  if (m.includes('qwen3') && m.includes('coder')) return 'qwen3_coder';
  if (m.includes('qwen')) return 'qwen25';
  if (m.includes('kimi')) return 'kimi_k2';
  if (m.includes('glm')) return 'glm45';
  if (m.includes('gpt-oss')) return 'gpt-oss';
  if (m.includes('deepseek') && /v3\.1|v31/.test(m)) return 'deepseekv31';
  if (m.includes('deepseek')) return 'deepseekv3';
  if (m.includes('llama')) return 'llama3';
  if (m.includes('mistral') || m.includes('mixtral')) return 'mistral';
  return "<the model's parser: qwen25, qwen3_coder, llama3, mistral, deepseekv3, kimi_k2, glm45, gpt-oss, …>";
}

/** One step the source recorded: an assistant message's calls and the `tool` messages that answer them. */
export interface SourceStep {
  calls: ToolCall[];
  results: ToolMessage[];
}

/** Why a target's step cannot be paired with the source's, or the tool messages to send after it. */
export type Pairing = { ok: true; results: ToolMessage[] } | { ok: false; reason: string };

/**
 * The source's results for the target's calls: call n gets the result of the source's call n (the
 * `tool` message naming its id, else the n-th one), its content as the source recorded it, under
 * the target's id. Under "name" the two calls must name the same function.
 */
export function pairStep(source: SourceStep | undefined, calls: readonly ToolCall[], pairing: 'name' | 'position'): Pairing {
  if (!source) return { ok: false, reason: 'the source took no such step: it answered with text' };
  if (source.calls.length !== calls.length) {
    return { ok: false, reason: `the target made ${calls.length} call(s) where the source made ${source.calls.length}` };
  }
  const results: ToolMessage[] = [];
  for (const [n, call] of calls.entries()) {
    const theirs = source.calls[n];
    if (pairing === 'name' && theirs.function?.name !== call.function.name) {
      return { ok: false, reason: `call ${n} names ${JSON.stringify(call.function.name)} where the source called ${JSON.stringify(theirs.function?.name)}` };
    }
    const result = source.results.find((r) => r.tool_call_id === theirs.id && theirs.id !== undefined) ?? source.results[n];
    if (!result) return { ok: false, reason: `the source has no result for its call ${n}` };
    const { tool_call_id: _id, ...rest } = result;
    results.push({ ...rest, role: 'tool', content: result.content, tool_call_id: call.id });
  }
  return { ok: true, results };
}

/**
 * ShareGPT's `function_call` value (the JSON text of one call, or of a list of parallel calls,
 * `{"name", "arguments"}` each) as `tool_calls` with the ids regen makes: `call_<line>_<k>`, k
 * counting the line's calls from 0. Throws a message naming what is wrong.
 */
export function sharegptCalls(value: string, line: number, first: number): ToolCall[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(value);
  } catch {
    throw new Error('must be the JSON text of a call {"name", "arguments"} or of a list of them');
  }
  const list = Array.isArray(parsed) ? parsed : [parsed];
  if (list.length === 0) throw new Error('holds no call');
  return list.map((c, i) => {
    const call = c as { name?: unknown; arguments?: unknown } | null;
    if (typeof call?.name !== 'string' || call.name === '') throw new Error(`call ${i} has no "name"`);
    const args = typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments ?? {});
    return { id: `call_${line}_${first + i}`, type: 'function', function: { name: call.name, arguments: args } };
  });
}

/** An answer's `tool_calls` as regen keeps them (id, name and arguments as strings); null when it made none. */
export function readToolCalls(value: unknown): ToolCall[] | null {
  if (!Array.isArray(value) || value.length === 0) return null;
  return value.map((c, i) => {
    const call = (c ?? {}) as { id?: unknown; function?: { name?: unknown; arguments?: unknown } };
    const args = call.function?.arguments;
    return {
      id: typeof call.id === 'string' && call.id !== '' ? call.id : `call_${i}`,
      type: 'function',
      function: {
        name: typeof call.function?.name === 'string' ? call.function.name : '',
        // Kept byte for byte; anything but a string is the server's own (flagged invalid_tool_arguments when not an object's JSON).
        arguments: typeof args === 'string' ? args : JSON.stringify(args ?? null),
      },
    };
  });
}
