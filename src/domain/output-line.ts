import { RawJson, stringifyExact } from './exact-json.js';
import { flagsFromBits, type Flag } from './flags.js';
import type { StagedIds } from './token-rows.js';
import type { ToolCall } from './tools.js';
import { isRaw, type RawRequest } from './raw-request.js';
import { type EncodingFormat, encodeEmbedding, encodingOf } from './run-endpoint.js';

// The lines of a run's output (docs/design.md "Runner"): shard-NNNNN.jsonl holds one OutputLine per
// completed sample, in input order; shard-NNNNN.errors.jsonl one ErrorLine per failed sample.
// Readers of the shards (batch output files, the sample route) parse these same types.

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  reasoning_tokens: number;
  cached_tokens: number;
}

/** A run's token usage, as the run object and the manifest show it. */
export function runUsage(r: { promptTokens: number; completionTokens: number; reasoningTokens: number }) {
  return { prompt_tokens: r.promptTokens, completion_tokens: r.completionTokens, reasoning_tokens: r.reasoningTokens };
}

/** A choice's token log probabilities, as the server sent them (SGLang sends `content` only). */
export interface ChoiceLogprobs {
  content?: unknown[] | null;
  refusal?: unknown[] | null;
}

/**
 * A choice past the first of an answer that holds several: an OpenAI batch line asking `n` in its
 * body gets them all in one sample, as OpenAI answers it.
 */
export interface OtherChoice {
  index: number;
  content: string | null;
  reasoning_content: string | null;
  /** null when the server sent this choice broken or not at all. */
  finish_reason: string | null;
  logprobs?: ChoiceLogprobs;
}

/** A conversation's turn as its output line's `turns` shows it (domain/conversation.ts). */
export interface TurnLine {
  /** The user turn (0-based) the request answered, and its step in it (0 for the turn's first request). */
  turn: number;
  step: number;
  /** How many tools a step called; absent on a turn's text answer. */
  tool_calls?: number;
  finish_reason: string | null;
  usage: Usage;
  endpoint_id: string | null;
  latency_ms: number;
  attempts: number;
  flags: Flag[];
}

/** What a conversation's line adds to its last turn's answer (`regenerate: "all_assistant"`). */
export interface StagedConversation {
  /** The regenerated conversation: each user message followed by its new reply. */
  messages: unknown[];
  turns: TurnLine[];
  /** Every turn's, added up. */
  usage: Usage;
  latency_ms: number;
  attempts: number;
}

/** What the staging table keeps of a completion until its shard is uploaded. */
export interface StagedOutput {
  reasoning_content: string | null;
  content: string | null;
  model: string;
  response_id?: string;
  created?: number;
  logprobs?: ChoiceLogprobs;
  choices?: OtherChoice[];
  /** A plain or last_assistant answer's calls. */
  tool_calls?: ToolCall[];
  conversation?: StagedConversation;
  /** An embeddings run's answer. */
  embedding?: number[];
  /** The server's ids of each generation the line keeps (output.tokens): its training rows, written under tokens/. */
  tokens?: StagedIds[];
}

/**
 * The line of a completions or embeddings run (`endpoint`): its raw `prompt` and the `text`
 * answered, or its `input` and the `embedding` (floats, or base64 as the request's
 * encoding_format asked), with the same bookkeeping as a chat line.
 */
export type RawOutputLine = Omit<OutputLine, 'messages' | 'reasoning_content' | 'content' | 'choices' | 'turns' | 'tools' | 'tool_calls'> & {
  prompt?: string | number[];
  text?: string | null;
  /** Choices 1…n−1 of a completion that asked `n` in an OpenAI batch line's body. */
  choices?: { index: number; text: string | null; finish_reason: string | null; logprobs?: unknown }[];
  input?: string | number[];
  embedding?: number[] | string;
};

export const isRawLine = (line: OutputLine | RawOutputLine): line is RawOutputLine => !('messages' in line);

export interface OutputLine {
  custom_id: string;
  /** Which of its line's params.n answers (0…n−1); 0 when the run asks one. */
  sample_index: number;
  messages: unknown[];
  reasoning_content: string | null;
  content: string | null;
  finish_reason: string | null;
  usage: Usage;
  model: string;
  /** The server's completion id and time: an OpenAI batch output line is rebuilt from them (null in shards written before batches). */
  response_id: string | null;
  created: number | null;
  /** Only on the lines of a request that asked for them, so other shards keep their bytes. */
  logprobs?: ChoiceLogprobs;
  /** Only on the line of an OpenAI batch request that asked `n` > 1 in its body: choices 1…n−1 (the line's own fields are choice 0). */
  choices?: OtherChoice[];
  endpoint_id: string | null;
  latency_ms: number | null;
  attempts: number;
  flags: Flag[];
  /** The name of the sample's variant; only on the lines of a run with variants. */
  variant?: string;
  /**
   * The input line's own fields regen did not consume; only on the lines of an input line that had
   * some. Each a RawJson (written as the input wrote it) when the line held numbers parsing changes.
   */
  metadata?: Record<string, unknown>;
  /** A conversation's turns, in order (`regenerate: "all_assistant"`). */
  turns?: TurnLine[];
  /** The tools the line's requests offered (its own, else the run's params.tools); only on lines that offered some. */
  tools?: unknown[];
  /** A plain or last_assistant answer's tool calls; only on an answer that made some. */
  tool_calls?: ToolCall[];
}

export interface ErrorLine {
  custom_id: string;
  sample_index: number;
  error: { code: string | null; message: string | null; status: number | null };
  attempts: number;
  /** A conversation's: the user turn (0-based) that failed it, and the request in it (0 for the turn's first, then its tool-call steps). */
  turn?: number;
  step?: number;
}

/** A completed sample's record, as the shard writer has it from the database. */
export interface CompletedSample {
  customId: string;
  sampleIndex: number;
  /** The request as stored: JSON of {messages, params?, metadata? | metadata_json?} (StoredMetadata). */
  request: string;
  finishReason: string | null;
  promptTokens: number | null;
  completionTokens: number | null;
  reasoningTokens: number | null;
  cachedTokens: number | null;
  endpointId: string | null;
  latencyMs: number | null;
  attempts: number;
  serverFaults: number;
  flags: number;
  /** The index of its variant in the run's variants, or null. */
  variant?: number | null;
}

export interface FailedSample {
  customId: string;
  sampleIndex: number;
  errorCode: string | null;
  errorMessage: string | null;
  errorStatus: number | null;
  attempts: number;
  serverFaults: number;
  /** A conversation's request being asked; null for a single request. */
  turn: number | null;
  /** Where that request stands in the conversation, when the writer walked its answered requests. */
  position?: { turn: number; step: number };
}

/**
 * How many times a sample was sent: the attempts charged against max_attempts and the ones
 * refunded after a server's fault. Output lines, error lines and the sample object report this.
 */
export function triesOf(s: { attempts: number; serverFaults: number }): number {
  return s.attempts + s.serverFaults;
}

/**
 * The input line's own fields as a stored request keeps them: their values, or, for a line holding
 * numbers parsing would change (input-line.ts), each field's JSON text as the line wrote it.
 */
export interface StoredMetadata {
  metadata?: Record<string, unknown>;
  metadata_json?: Record<string, string>;
  /** The line's id was a JSON number (its custom_id is the number as written). */
  numeric_id?: true;
}

/** The line's own fields as the output writes them: each a RawJson when they were kept as written. */
export function outputMetadata(request: StoredMetadata): Record<string, unknown> | undefined {
  if (!request.metadata_json) return request.metadata;
  return Object.fromEntries(Object.entries(request.metadata_json).map(([key, text]) => [key, new RawJson(text)]));
}

/** The line's own fields as values, for a JSON answer (numbers kept as written come back as doubles there). */
export function metadataValues(request: StoredMetadata): Record<string, unknown> | undefined {
  if (!request.metadata_json) return request.metadata;
  return Object.fromEntries(Object.entries(request.metadata_json).map(([key, text]) => [key, JSON.parse(text)]));
}

/** A completed sample's line as text: its fields kept as written are written so. */
export function lineText(line: OutputLine | RawOutputLine): string {
  return line.metadata ? stringifyExact(line) : JSON.stringify(line);
}

/** A completed sample's line; `variants` are the run's variant names, by index (null for a run without variants). */
export function outputLine(s: CompletedSample, out: StagedOutput, variants: readonly string[] | null = null, runTools: unknown = undefined): string {
  return lineText(outputRecord(s, out, variants, runTools));
}

/**
 * A completed sample's line as an object, before it is written in the run's format; `runTools`, the
 * run's `params.tools`, stand where the line has none, and `runEncoding` (an embedding's, from the
 * run's params) where the line names no encoding_format.
 */
export function outputRecord(
  s: CompletedSample,
  out: StagedOutput,
  variants: readonly string[] | null = null,
  runTools: unknown = undefined,
  runEncoding: EncodingFormat = 'float',
): OutputLine | RawOutputLine {
  const request = JSON.parse(s.request) as { messages: unknown[]; params?: { tools?: unknown; encoding_format?: unknown } } & StoredMetadata;
  const metadata = outputMetadata(request);
  const tools = request.params?.tools ?? runTools;
  const variant = variants && s.variant !== null && s.variant !== undefined ? variants[s.variant] : undefined;
  if (isRaw(request)) {
    const encoding = request.params?.encoding_format === undefined ? runEncoding : encodingOf(request.params);
    return rawOutputRecord(s, out, request, encoding, variant, metadata);
  }
  const conv = out.conversation;
  const line: OutputLine = {
    custom_id: s.customId,
    sample_index: s.sampleIndex,
    messages: conv ? conv.messages : request.messages,
    reasoning_content: out.reasoning_content,
    content: out.content,
    finish_reason: s.finishReason,
    usage: conv ? conv.usage : usageOf(s),
    model: out.model,
    response_id: out.response_id ?? null,
    created: out.created ?? null,
    ...(out.logprobs && { logprobs: out.logprobs }),
    ...(out.choices && { choices: out.choices }),
    endpoint_id: s.endpointId,
    latency_ms: conv ? conv.latency_ms : s.latencyMs,
    attempts: conv ? conv.attempts : triesOf(s),
    flags: flagsFromBits(s.flags),
    ...(variant !== undefined && { variant }),
    ...(metadata && { metadata }),
    ...(conv && { turns: conv.turns }),
    ...(Array.isArray(tools) && tools.length > 0 && { tools }),
    ...(out.tool_calls && { tool_calls: out.tool_calls }),
  };
  return line;
}

/** A single request's usage as its sample recorded it. */
function usageOf(s: CompletedSample) {
  return {
    prompt_tokens: s.promptTokens ?? 0,
    completion_tokens: s.completionTokens ?? 0,
    reasoning_tokens: s.reasoningTokens ?? 0,
    cached_tokens: s.cachedTokens ?? 0,
  };
}

function rawOutputRecord(
  s: CompletedSample,
  out: StagedOutput,
  request: RawRequest,
  encoding: EncodingFormat,
  variant: string | undefined,
  metadata: Record<string, unknown> | undefined,
): RawOutputLine {
  const answer =
    'prompt' in request
      ? {
          prompt: request.prompt,
          text: out.content,
          ...(out.choices && {
            choices: out.choices.map((c) => ({ index: c.index, text: c.content, finish_reason: c.finish_reason, ...(c.logprobs && { logprobs: c.logprobs }) })),
          }),
        }
      : { input: request.input, embedding: encodeEmbedding(out.embedding ?? [], encoding) };
  return {
    custom_id: s.customId,
    sample_index: s.sampleIndex,
    ...answer,
    finish_reason: s.finishReason,
    usage: usageOf(s),
    model: out.model,
    response_id: out.response_id ?? null,
    created: out.created ?? null,
    ...(out.logprobs && { logprobs: out.logprobs }),
    endpoint_id: s.endpointId,
    latency_ms: s.latencyMs,
    attempts: triesOf(s),
    flags: flagsFromBits(s.flags),
    ...(variant !== undefined && { variant }),
    ...(metadata && { metadata }),
  };
}

export function errorLine(s: FailedSample): string {
  const line: ErrorLine = {
    custom_id: s.customId,
    sample_index: s.sampleIndex,
    error: { code: s.errorCode, message: s.errorMessage, status: s.errorStatus },
    attempts: triesOf(s),
    ...(s.turn !== null && (s.position ?? { turn: s.turn })),
  };
  return JSON.stringify(line);
}

/** A sample's key among a shard's lines: its custom_id and sample_index (lines of old shards, without one, are answer 0). */
export const lineKey = (customId: string, sampleIndex: number | undefined) => `${sampleIndex ?? 0}\0${customId}`;

export const MANIFEST_KEY = 'manifest.json';
