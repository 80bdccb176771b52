import { flagsFromBits } from './flags.js';
import type { TurnLine, Usage } from './output-line.js';

// A conversation regenerated turn by turn (`regenerate: "all_assistant"`): its stored messages are
// the input's system and user messages (the old assistant turns dropped, domain/input-line.ts);
// turn k answers the (k+1)th user message, asked with the replies regenerated for the ones before.

/** One answered turn, as stored (db/sample-turns.ts) and carried by the runner to the next turn. */
export interface TurnRecord {
  idx: number;
  content: string | null;
  reasoningContent: string | null;
  finishReason: string | null;
  usage: Usage;
  endpointId: string | null;
  latencyMs: number;
  /** Times the turn was sent (attempts charged and refunded). */
  attempts: number;
  flags: number;
}

type Message = { role: string; content?: unknown };

/** The assistant turns a conversation asks for: one a user message. */
export function turnCount(messages: readonly Message[]): number {
  return messages.filter((m) => m.role === 'user').length;
}

/**
 * The messages sent for turn `turn`: everything up to its user message, each earlier user message
 * followed by the reply regenerated for it. The reply goes back as its content only: Qwen3's chat
 * template drops the thinking of earlier turns, so sending it would change nothing but the bytes.
 */
export function turnMessages(messages: readonly Message[], replies: readonly Pick<TurnRecord, 'content'>[], turn: number): Message[] {
  const out: Message[] = [];
  let user = 0;
  for (const m of messages) {
    if (m.role !== 'user') {
      out.push(m);
      continue;
    }
    if (user > 0) out.push({ role: 'assistant', content: replies[user - 1]?.content ?? '' });
    out.push(m);
    if (user++ === turn) break;
  }
  return out;
}

/** The regenerated conversation: each user message followed by its new reply, reasoning included. */
export function regeneratedMessages(messages: readonly Message[], turns: readonly Pick<TurnRecord, 'content' | 'reasoningContent'>[]): unknown[] {
  const out: unknown[] = [];
  let user = 0;
  for (const m of messages) {
    out.push(m);
    if (m.role !== 'user') continue;
    const t = turns[user++];
    if (t) out.push({ role: 'assistant', content: t.content, reasoning_content: t.reasoningContent });
  }
  return out;
}

export function turnLine(t: TurnRecord): TurnLine {
  return {
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
