import { conversationIds, stagedIds } from '../domain/token-rows.js';
import type { Outcome } from '../db/results.js';
import { type OnLength, walkSettings } from '../domain/run-settings.js';
import { totalUsage, type TurnRecord, turnCount, turnLines, unionFlags, walk } from '../domain/conversation.js';
import { flagBit } from '../domain/flags.js';
import type { QualityConfig } from '../domain/quality.js';
import type { StagedOutput } from '../domain/output-line.js';
import type { RetryReason, SampleError } from '../domain/sample-errors.js';
import { decideFailure } from './failure-policy.js';
import type { Answer } from './request.js';

// What one attempt's answer or error makes of its sample: the outcome the result writer commits,
// and the retry reason /metrics counts. Pure: the runner does the rest (endpoint health, stats).

/** One attempt at a sample, as the runner sent it. */
export interface Attempt {
  sampleId: number;
  runId: string;
  shardIdx: number;
  endpointId: string;
  /** Attempts charged so far, this one included. */
  attempts: number;
  qualityRetries: number;
  serverFaults: number;
  /** Thinking was asked for (missing_reasoning is checked). */
  thinking: boolean;
  /** The run was cancelled while the request ran: an answer is kept, nothing is asked again. */
  cancelled: boolean;
  /** The endpoint was quarantined while the request ran: a flagged answer from it is asked again elsewhere, whatever the retries left. */
  quarantined: boolean;
  /** The index of the sample's variant, or null. */
  variant: number | null;
  /** The max_tokens the request asked (max_completion_tokens first), or null when it asked none. */
  maxTokens: number | null;
  /** The endpoint's context length (max_model_len), when its probes found it. */
  contextLength: number | null;
  /** The request's prompt tokens when its usage went to another choice (params.n: one prefill for all). */
  requestPromptTokens?: number | null;
  /** A conversation's turn (`regenerate: "all_assistant"`); null for a single request. */
  conversation: ConversationTurn | null;
}

/** The request of a conversation an attempt asks. */
export interface ConversationTurn {
  /** The request's place in the conversation (samples.turn). */
  turn: number;
  /** The conversation's stored messages: its system and user messages, the source's tool-call steps. */
  messages: { role: string }[];
  /** The requests answered before this one. */
  history: TurnRecord[];
}

/** The run's settings a conversation's answer is settled under. */
export interface SettleRun {
  model: string;
  quality: QualityConfig | null;
  onLength?: OnLength | string;
  toolPairing?: string | null;
  onToolMismatch?: string | null;
  historyReasoning?: string | null;
}

export interface Settled {
  outcome: Outcome;
  retried: RetryReason | null;
}

const base = (a: Attempt) => ({ sampleId: a.sampleId, runId: a.runId, shardIdx: a.shardIdx, endpointId: a.endpointId, variant: a.variant });

/**
 * The max_tokens a cut answer is asked again with under on_length "retry": twice what it had, at
 * most what the context leaves after the prompt (SGLang refuses prompt + max_tokens >= context,
 * docs/sglang.md); null when no more room is left (a request that asked no max_tokens already had
 * all of it). Without a known context, only doubled.
 */
export function nextMaxTokens(asked: number | null, promptTokens: number, contextLength: number | null): number | null {
  if (asked === null) return null;
  const room = contextLength === null ? Number.POSITIVE_INFINITY : contextLength - promptTokens - 1;
  const next = Math.min(asked * 2, room);
  return next > asked ? next : null;
}

/** An answer cut by max_tokens under on_length "retry" or "fail": asked again with more room, or failed with a clear error. */
function settleCut(a: Attempt, onLength: 'retry' | 'fail', answer: Answer, now: number): Settled {
  // A conversation's cut turn fails the conversation naming that turn, as any turn's failure does.
  const turn = a.conversation && { turn: a.conversation.turn };
  const which = a.conversation ? `${requestName(a.conversation)}'s answer` : 'the answer';
  if (onLength === 'fail') {
    const message = `${which} was cut at max_tokens ${a.maxTokens ?? '(the context)'} (finish_reason length), and the run's on_length is "fail"`;
    return { retried: null, outcome: { ...base(a), kind: 'failed', error: { code: 'truncated', message, status: null }, at: now, ...turn } };
  }
  const prompt = a.requestPromptTokens ?? answer.usage.prompt_tokens;
  const next = nextMaxTokens(a.maxTokens, prompt, a.contextLength);
  if (next === null) {
    const room = a.contextLength === null ? '' : ` (the context of ${a.contextLength} tokens, less the prompt's ${prompt})`;
    const message = `${which} was still cut at max_tokens ${a.maxTokens ?? '(the context)'}, as much as the context leaves${room}: on_length "retry" has no more room to give`;
    return { retried: null, outcome: { ...base(a), kind: 'failed', error: { code: 'length_exhausted', message, status: null }, at: now, ...turn } };
  }
  return {
    retried: 'length',
    outcome: { ...base(a), kind: 'retry', availableAt: 0, usage: answer.usage, qualityRetry: false, serverFault: false, error: null, maxTokens: next },
  };
}

/** A completion with its flags: kept, or asked again with a new seed when flagged and retries are left. */
export function settleAnswer(a: Attempt, run: SettleRun, answer: Answer, latencyMs: number, now: number, flags: number): Settled {
  const { usage } = answer;
  if (answer.finishReason === 'length' && (run.onLength === 'retry' || run.onLength === 'fail') && !a.cancelled) {
    return settleCut(a, run.onLength, answer, now);
  }
  if (flags && run.quality && a.quarantined && !a.cancelled) {
    return { retried: 'quality', outcome: { ...base(a), kind: 'retry', availableAt: 0, usage, qualityRetry: false, serverFault: false, error: null } };
  }
  if (flags && run.quality && a.qualityRetries < run.quality.retry_flagged && !a.cancelled) {
    return { retried: 'quality', outcome: { ...base(a), kind: 'retry', availableAt: 0, usage, qualityRetry: true, serverFault: false, error: null } };
  }
  const output: StagedOutput = {
    reasoning_content: answer.reasoning,
    content: answer.content,
    model: answer.model ?? run.model,
    response_id: answer.responseId,
    created: answer.created,
    ...(answer.logprobs && { logprobs: answer.logprobs }),
    ...(answer.others && { choices: answer.others }),
    ...(answer.embedding && { embedding: answer.embedding }),
  };
  const chars = { reasoning: answer.reasoning?.length ?? 0, content: answer.content?.length ?? 0 };
  const c = a.conversation;
  if (!c) {
    if (answer.toolCalls) output.tool_calls = answer.toolCalls;
    if (answer.ids) output.tokens = [{ turn: null, step: null, finish_reason: answer.finishReason, flags, ...stagedIds(answer.ids) }];
    return {
      retried: null,
      outcome: { ...base(a), kind: 'completed', usage, finishReason: answer.finishReason, latencyMs, flags, chars, output: JSON.stringify(output), at: now },
    };
  }
  const settings = walkSettings(run);
  const at = walk(c.messages, c.history, settings);
  const turn: TurnRecord = {
    idx: c.turn,
    step: at.step,
    // A step's content is what the model said before its calls: often nothing, which SGLang sends as null or "".
    content: answer.toolCalls && answer.content === '' ? null : answer.content,
    reasoningContent: answer.reasoning,
    toolCalls: answer.toolCalls,
    finishReason: answer.finishReason,
    usage,
    endpointId: a.endpointId,
    latencyMs,
    attempts: a.attempts + a.serverFaults,
    flags,
    ...(answer.ids && { ids: stagedIds(answer.ids) }),
  };
  const turns = [...c.history, turn];
  // The conversation's flags are any turn's: a flagged turn flags its conversation.
  const union = unionFlags(turns);
  const after = walk(c.messages, turns, settings);
  if (after.mismatch) return settleMismatch(a, run, turn, after, output, now);
  if (turn.toolCalls || at.turn + 1 < turnCount(c.messages)) return { retried: null, outcome: { ...base(a), kind: 'turn', turn, flags: union } };
  output.conversation = conversationOf(after.messages, turns);
  output.tokens = conversationIds(turns);
  // The sample's row gets the whole conversation's tokens and time: the forecast's slice measures
  // conversations (every turn's tokens), and the run's counters already hold the earlier turns'.
  return {
    retried: null,
    outcome: {
      ...base(a),
      kind: 'completed',
      usage: output.conversation.usage,
      finishReason: answer.finishReason,
      latencyMs: output.conversation.latency_ms,
      flags: union,
      chars,
      output: JSON.stringify(output),
      at: now,
      turn,
    },
  };
}

/** What a conversation's line adds: its messages, and its requests' lines and totals. */
function conversationOf(messages: unknown[], turns: readonly TurnRecord[]): NonNullable<StagedOutput['conversation']> {
  return {
    messages,
    turns: turnLines(turns),
    usage: totalUsage(turns),
    latency_ms: turns.reduce((n, t) => n + t.latencyMs, 0),
    attempts: turns.reduce((n, t) => n + t.attempts, 0),
  };
}

/** "turn 2 step 1", or "turn 2" for a turn's first request. */
function requestName(c: ConversationTurn): string {
  const at = walk(c.messages, c.history);
  return at.step > 0 ? `turn ${at.turn} step ${at.step}` : `turn ${at.turn}`;
}

/**
 * A step whose calls cannot be paired with the source's: the conversation ends at its last
 * complete user turn, flagged tool_mismatch, its answer stored so that a retry of the flagged asks
 * it again; with no complete turn, or under on_tool_mismatch "fail", the line fails.
 */
function settleMismatch(a: Attempt, run: SettleRun, turn: TurnRecord, at: ReturnType<typeof walk>, output: StagedOutput, now: number): Settled {
  const message = `the target's tool calls cannot be paired with the source's at ${at.mismatch}`;
  if (at.completeRequests === 0 || run.onToolMismatch === 'fail') {
    const where = { turn: at.turn, step: at.step };
    const error = { code: 'tool_mismatch' as const, message: `${message} (turn ${where.turn}, step ${where.step})`, status: null };
    return { retried: null, outcome: { ...base(a), kind: 'failed', error, at: now, turn: a.conversation?.turn ?? 0 } };
  }
  const kept = a.conversation?.history.slice(0, at.completeRequests) ?? [];
  const last = kept.at(-1);
  const flags = unionFlags(kept) | flagBit('tool_mismatch');
  const stored = { ...turn, flags: turn.flags | flagBit('tool_mismatch') };
  const line: StagedOutput = { ...output, content: last?.content ?? null, reasoning_content: last?.reasoningContent ?? null };
  line.conversation = conversationOf(at.messages.slice(0, at.complete), kept);
  line.tokens = conversationIds(kept);
  return {
    retried: null,
    outcome: {
      ...base(a),
      kind: 'completed',
      usage: line.conversation.usage,
      finishReason: last?.finishReason ?? null,
      latencyMs: line.conversation.latency_ms,
      flags,
      chars: { reasoning: last?.reasoningContent?.length ?? 0, content: last?.content?.length ?? 0 },
      output: JSON.stringify(line),
      at: now,
      turn: stored,
    },
  };
}

/** A failed attempt: failed for good, or back in the queue after a backoff. */
export function settleError(
  a: Attempt,
  limits: { maxAttempts: number; maxServerFaults: number; retryMs: number },
  error: SampleError,
  now: number,
  random: () => number = Math.random,
): Settled {
  const budget = { ...limits, attempts: a.attempts, serverFaults: a.serverFaults };
  const decision = decideFailure(error, budget, random);
  if (decision.kind === 'failed') return settleFailed(a, error, now);
  const retry = { kind: 'retry' as const, availableAt: now + decision.delayMs, usage: null, qualityRetry: false, serverFault: decision.serverFault, error };
  return { retried: error.code, outcome: { ...base(a), ...retry } };
}

/** A failed attempt that ends its sample whatever its budgets leave (an answer cut too often to keep the memory budget). */
export function settleFailed(a: Attempt, error: SampleError, now: number): Settled {
  return { retried: null, outcome: { ...base(a), kind: 'failed', error, at: now, ...(a.conversation && { turn: a.conversation.turn }) } };
}

/** Regen aborted the request itself (or cut its answer to keep its memory budget): a cancel ends the sample, anything else gives it back unspent. */
export function settleAbort(a: Attempt, reason: 'cancel' | 'release'): Settled {
  return { retried: null, outcome: { ...base(a), kind: reason === 'cancel' ? 'cancelled' : 'release' } };
}

/** The turn a claimed conversation is at, or null for a single request. */
export function claimedConversation(sample: { turn: number | null; request: string; history?: TurnRecord[] }): ConversationTurn | null {
  if (sample.turn === null) return null;
  const { messages } = JSON.parse(sample.request) as { messages: { role: string }[] };
  return { turn: sample.turn, messages, history: sample.history ?? [] };
}
