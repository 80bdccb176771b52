import type { TurnIds } from './token-rows.js';
import { flagsFromBits } from './flags.js';
import type { TurnLine, Usage } from './output-line.js';
import type { HistoryReasoning, ToolPairing } from './run-settings.js';
import { callsOf, pairStep, type SourceStep, type ToolCall } from './tools.js';

// A conversation regenerated turn by turn (`regenerate: "all_assistant"`): its stored messages are
// the input's system and user messages and the source's tool-call steps (the old text answers
// dropped, domain/input-line.ts); turn k answers the (k+1)th user message, asked with the replies
// regenerated for the ones before. While the target answers a turn with tool calls, each answer is
// a step: the source's results are paired with its calls (domain/tools.ts) and it is asked again.

/** One answered request (a turn's final answer, or a tool-call step), as stored (db/sample-turns.ts) and carried by the runner to the next. */
export interface TurnRecord {
  /** The request's place in the conversation, 0-based: sample_turns.idx. */
  idx: number;
  /** Its place in its user turn: 0 for the turn's first request, one more per step before it. */
  step: number;
  content: string | null;
  reasoningContent: string | null;
  /** The target's calls when the answer was a step; null for a text answer. */
  toolCalls: ToolCall[] | null;
  finishReason: string | null;
  usage: Usage;
  endpointId: string | null;
  latencyMs: number;
  /** Times the request was sent (attempts charged and refunded). */
  attempts: number;
  flags: number;
  /** The server's token ids for the request, packed, when its run writes them (output.tokens). */
  ids?: TurnIds | null;
}

type Message = { role: string; content?: unknown; [k: string]: unknown };

/** The assistant turns a conversation asks for: one a user message. */
export function turnCount(messages: readonly Message[]): number {
  return messages.filter((m) => m.role === 'user').length;
}

/** One user turn of the stored conversation: the messages that lead to it (its user message last), and the steps the source took answering it. */
interface SourceTurn {
  lead: Message[];
  steps: SourceStep[];
}

/**
 * The stored conversation as user turns: its system and user messages, and the source's tool-call
 * steps (an assistant message with `tool_calls`, the `tool` messages after it) under the turn they
 * answer (domain/input-line.ts keeps nothing else of the source's assistant turns).
 */
function sourceTurns(messages: readonly Message[]): SourceTurn[] {
  const turns: SourceTurn[] = [];
  let lead: Message[] = [];
  for (const m of messages) {
    const current = turns.at(-1);
    if (m.role === 'assistant') current?.steps.push({ calls: callsOf(m) ?? [], results: [] });
    else if (m.role === 'tool') current?.steps.at(-1)?.results.push(m);
    else {
      lead.push(m);
      if (m.role === 'user') {
        turns.push({ lead, steps: [] });
        lead = [];
      }
    }
  }
  return turns;
}

/** The requests the source's conversation took: one a user turn, one more a tool-call step (the run's estimate until the target's walk is known). */
export function requestCount(messages: readonly Message[]): number {
  return messages.filter((m) => m.role === 'user' || (m.role === 'assistant' && callsOf(m) !== null)).length;
}

/** How a conversation is walked: the run's tool_pairing and history_reasoning. */
export interface WalkSettings {
  pairing: ToolPairing;
  reasoning: HistoryReasoning;
}

export const DEFAULT_WALK: WalkSettings = { pairing: 'name', reasoning: 'loop' };

/** Where a walk of the answered requests stands. */
export interface Walk {
  /** The regenerated conversation so far (every assistant message with its reasoning_content). */
  messages: Message[];
  /** The user turn the next request answers (the turn count when all are done), and its step. */
  turn: number;
  step: number;
  /** Messages of the complete user turns: what a truncated line keeps. */
  complete: number;
  /** Requests of the complete user turns. */
  completeRequests: number;
  /** The last answered step could not be paired with the source's: why. */
  mismatch: string | null;
}

/**
 * Walks the stored conversation with the answered requests: each user turn's lead, then its steps
 * (the target's call message, the source's paired results under the target's ids), then its final
 * answer. Stops at the first request whose step cannot be paired.
 */
export function walk(messages: readonly Message[], records: readonly TurnRecord[], settings: WalkSettings = DEFAULT_WALK): Walk {
  const turns = sourceTurns(messages);
  const out: Message[] = [];
  let r = 0;
  let complete = 0;
  let completeRequests = 0;
  for (const [t, turn] of turns.entries()) {
    out.push(...turn.lead);
    let step = 0;
    for (;;) {
      const record = records[r];
      if (!record) return { messages: out, turn: t, step, complete, completeRequests, mismatch: null };
      r++;
      if (!record.toolCalls) {
        out.push({ role: 'assistant', content: record.content, reasoning_content: record.reasoningContent });
        break;
      }
      const paired = pairStep(turn.steps[step], record.toolCalls, settings.pairing);
      if (!paired.ok) return { messages: out, turn: t, step, complete, completeRequests, mismatch: `turn ${t} step ${step}: ${paired.reason}` };
      out.push({ role: 'assistant', content: record.content, reasoning_content: record.reasoningContent, tool_calls: record.toolCalls }, ...paired.results);
      step++;
    }
    complete = out.length;
    completeRequests = r;
  }
  return { messages: out, turn: turns.length, step: 0, complete, completeRequests, mismatch: null };
}

/**
 * The messages sent for the next request: the walk so far, each assistant message's reasoning
 * kept as `history_reasoning` says. Plain turns go back as their content only (Qwen3's template
 * drops the thinking of earlier turns); inside a tool loop (after the last user message) Qwen3
 * renders it and Kimi K2.5 and GLM need it, hence "loop" by default.
 */
export function turnMessages(messages: readonly Message[], records: readonly TurnRecord[], settings: WalkSettings = DEFAULT_WALK): Message[] {
  const sent = walk(messages, records, settings).messages;
  let lastUser = -1;
  for (const [i, m] of sent.entries()) if (m.role === 'user') lastUser = i;
  return sent.map((m, i) => {
    if (m.role !== 'assistant') return m;
    const { reasoning_content, ...rest } = m;
    const keep = settings.reasoning === 'all' || (settings.reasoning === 'loop' && i > lastUser);
    return keep && typeof reasoning_content === 'string' ? m : rest;
  });
}

/** The regenerated conversation: each user message followed by its steps and new reply, reasoning included. */
export function regeneratedMessages(messages: readonly Message[], records: readonly TurnRecord[], settings: WalkSettings = DEFAULT_WALK): unknown[] {
  return walk(messages, records, settings).messages;
}

/** Each request as its line's `turns` shows it: its user turn and step, how it went. */
export function turnLines(records: readonly TurnRecord[]): TurnLine[] {
  let turn = 0;
  return records.map((t) => {
    const line = turnLine(t, turn);
    if (!t.toolCalls) turn++;
    return line;
  });
}

function turnLine(t: TurnRecord, turn: number): TurnLine {
  return {
    turn,
    step: t.step,
    ...(t.toolCalls && { tool_calls: t.toolCalls.length }),
    finish_reason: t.finishReason,
    usage: t.usage,
    endpoint_id: t.endpointId,
    latency_ms: t.latencyMs,
    attempts: t.attempts,
    flags: flagsFromBits(t.flags),
  };
}

/** The turns' usage added up: what the conversation's line reports as its own. */
export function totalUsage(turns: readonly { usage: Usage }[]): Usage {
  const total: Usage = { prompt_tokens: 0, completion_tokens: 0, reasoning_tokens: 0, cached_tokens: 0 };
  for (const { usage } of turns) {
    total.prompt_tokens += usage.prompt_tokens;
    total.completion_tokens += usage.completion_tokens;
    total.reasoning_tokens += usage.reasoning_tokens;
    total.cached_tokens += usage.cached_tokens;
  }
  return total;
}

/** The flags of any turn. */
export function unionFlags(turns: readonly { flags: number }[]): number {
  return turns.reduce((bits, t) => bits | t.flags, 0);
}
