import { bitsFromFlags, FLAGS, flagCounts, type Flag, type FlagCounterKey } from './flags.js';
import { argumentsValid, callMarkupIn, type ToolCall } from './tools.js';
import { fewTrainable } from './token-rows.js';

// Quality checks run on every completed sample (docs/design.md "Quality"), and the gate pauses a run
// whose flagged share is over its limit.

export interface QualityConfig {
  min_completion_tokens: number;
  retry_flagged: number;
  gate: { min_samples: number; max_flag_rate: number } | false;
  /** Stream each answer and cut it once it loops (README "The quality gate"). Absent on runs made before it existed: on. */
  stop_loops: boolean;
  /** A generation with fewer generated ids is flagged few_trainable (runs with output.tokens). Absent on runs made before it existed: the default. */
  min_trainable_tokens?: number;
}
export type GateSettings = Exclude<QualityConfig['gate'], false>;

/** What a run asks for, field by field; false turns quality checks off. */
export type QualityRequest =
  | false
  | {
      min_completion_tokens?: number;
      retry_flagged?: number;
      gate?: false | { min_samples?: number; max_flag_rate?: number };
      stop_loops?: boolean;
      min_trainable_tokens?: number;
    };

export const QUALITY_DEFAULTS: QualityConfig = {
  min_completion_tokens: 0,
  retry_flagged: 1,
  gate: { min_samples: 200, max_flag_rate: 0.2 },
  stop_loops: true,
  // The six-token loss mask of an empty think block and "OK." (README "Training rows") is far below it.
  min_trainable_tokens: 16,
};

/**
 * The settings a run keeps: what it asked for over the defaults, or null when checks are off.
 * min_trainable_tokens only where it applies (a run that writes token ids) or was asked for, so
 * other runs' settings read as they always have.
 */
export function qualityConfig(q: QualityRequest | undefined, writesTokens = false): QualityConfig | null {
  if (q === false) return null;
  const gate = q?.gate === false ? false : { ...(QUALITY_DEFAULTS.gate as GateSettings), ...(q?.gate ?? {}) };
  return {
    min_completion_tokens: q?.min_completion_tokens ?? QUALITY_DEFAULTS.min_completion_tokens,
    retry_flagged: q?.retry_flagged ?? QUALITY_DEFAULTS.retry_flagged,
    gate,
    stop_loops: q?.stop_loops ?? QUALITY_DEFAULTS.stop_loops,
    ...((writesTokens || q?.min_trainable_tokens !== undefined) && { min_trainable_tokens: q?.min_trainable_tokens ?? QUALITY_DEFAULTS.min_trainable_tokens }),
  };
}

/** Whether a run's answers are streamed and cut once they loop: quality checks on, and stop_loops not turned off. */
export function stopsLoops(q: QualityConfig | null): boolean {
  return q !== null && (q.stop_loops ?? QUALITY_DEFAULTS.stop_loops);
}

export interface QualityInput {
  content: string | null;
  reasoning_content: string | null;
  finish_reason: string | null;
  completion_tokens: number;
  thinking_requested: boolean;
  /** The answer's tool calls: a step, judged as one (no content or length checks); null or absent for a text answer. */
  tool_calls?: readonly ToolCall[] | null;
  /** The names of the functions the request offered, or null when it offered none. */
  tools?: ReadonlySet<string> | null;
  /** A raw prompt's completion (`/v1/completions`): no chat template wraps it, so a think tag in its text is the model's own. */
  raw?: boolean;
  /** The generated token ids the server returned (output.tokens), or null/absent when the run writes none. */
  trainable_tokens?: number | null;
}

/** Whether an answer is a tool-call step. */
export function isStep(input: Pick<QualityInput, 'tool_calls'>): boolean {
  return (input.tool_calls?.length ?? 0) > 0;
}

export interface QualityCheckConfig {
  /** 0 disables the too_short check. */
  min_completion_tokens: number;
  /** Below it a generation with ids is flagged few_trainable; absent, the default. */
  min_trainable_tokens?: number;
}

export function computeFlags(input: QualityInput, cfg: QualityCheckConfig): number {
  const flags: Flag[] = [];
  // A step's content is often null: that is what a step is, and its length says nothing.
  const step = isStep(input);
  if (!step && isBlank(input.content)) flags.push('empty_content');
  if (input.thinking_requested && isBlank(input.reasoning_content)) flags.push('missing_reasoning');
  if (input.finish_reason === 'length') flags.push('truncated');
  // A loop in the reasoning matters even when the answer looks fine: it is training data too.
  if (isRepetitive(input.content ?? '') || isRepetitive(input.reasoning_content ?? '')) flags.push('repetitive');
  if (!step && input.completion_tokens < cfg.min_completion_tokens) flags.push('too_short');
  if (!input.raw && hasThinkTag(input.content)) flags.push('think_in_content');
  if (input.tools && !step && callMarkupIn(input.content)) flags.push('tool_call_in_content');
  const least = cfg.min_trainable_tokens ?? (QUALITY_DEFAULTS.min_trainable_tokens as number);
  if (!step && typeof input.trainable_tokens === 'number' && fewTrainable(input.trainable_tokens, input.finish_reason, least)) flags.push('few_trainable');
  for (const call of input.tool_calls ?? []) {
    if (!argumentsValid(call.function.arguments) && !flags.includes('invalid_tool_arguments')) flags.push('invalid_tool_arguments');
    if (input.tools && !input.tools.has(call.function.name) && !flags.includes('unknown_tool')) flags.push('unknown_tool');
  }
  return bitsFromFlags(flags);
}

/**
 * A think tag in the answer: the server runs without `--reasoning-parser`, so the think block
 * stays inside content (docs/sglang.md "Chat completions"), whole or cut open by max_tokens. Qwen3's
 * template can put `<think>` in the prompt, leaving only `</think>` in the text: either tag counts.
 */
export function hasThinkTag(content: string | null): boolean {
  return content !== null && (content.includes('<think>') || content.includes('</think>'));
}

function isBlank(text: string | null): boolean {
  return text === null || text.trim() === '';
}

// Only the end of a text is examined: a model stuck in a loop stays in it until the token
// limit, so the loop is always at the tail, and a bounded window keeps the check O(1) in
// the text's length.
const TAIL_CHARS = 2000;
// Raw characters read to fill the window after whitespace runs are collapsed.
const RAW_TAIL_CHARS = 2 * TAIL_CHARS;
const MIN_REPEATS = 4;
// As long as a span can be and still repeat MIN_REPEATS times in the window: reasoning models
// loop on whole paragraphs (300-500 characters) as often as on short phrases.
const MAX_PERIOD = TAIL_CHARS / MIN_REPEATS;
// A loop must cover this much of the tail, unless the whole text is shorter: then it must
// cover all of it. Shorter runs are legitimate (a rule of dashes, a row of zeros).
const MIN_COVERAGE = 300;
// Below this a text is too short to call a loop ("0000", "ha ha ha ha").
const MIN_LOOP_CHARS = 20;

/**
 * True when the tail of `text` is one span of 1..500 characters repeated at least 4 times,
 * covering 300 characters (or the whole text), once whitespace runs count as one space.
 * Cost is at most TAIL_CHARS × MAX_PERIOD character comparisons whatever the text's size,
 * and far less on healthy text, where every candidate period fails within a few characters.
 */
export function isRepetitive(text: string): boolean {
  const tail = normalisedTail(text);
  if (tail.length < MIN_LOOP_CHARS) return false;
  const required = Math.max(MIN_LOOP_CHARS, Math.min(MIN_COVERAGE, tail.length));
  const maxPeriod = Math.min(MAX_PERIOD, Math.floor(tail.length / MIN_REPEATS));
  for (let period = 1; period <= maxPeriod; period++) {
    const covered = periodicSuffixLength(tail, period);
    if (covered >= required && covered >= period * MIN_REPEATS) return true;
  }
  return false;
}

/**
 * Every whitespace run that is not already one space: replacing these with a space gives what
 * /\s+/g would, without rewriting each single space of the text (that made it 10 times slower).
 */
export const WHITESPACE_TO_COLLAPSE = /\s{2,}|[^\S ]/g;

function normalisedTail(text: string): string {
  const normalised = text.slice(-RAW_TAIL_CHARS).replace(WHITESPACE_TO_COLLAPSE, ' ').trim();
  return normalised.slice(-TAIL_CHARS);
}

// ---- the same check on a streamed answer ----

// The growing text is checked every this many new characters (about 64 tokens): isRepetitive costs
// a few microseconds on healthy text, so per character it is noise, and a loop is caught within
// this much of the point where the final check would flag it.
const STREAM_CHECK_CHARS = 256;
// A loop must still be there at the next check: a periodic stretch the model leaves again (a rule
// of dashes, a table's separators) is not cut.
const STREAM_CONFIRMATIONS = 2;

/**
 * isRepetitive over a text that arrives in pieces, in O(1) amortised time a piece and bounded
 * memory: it keeps only the tail the check reads. True once the tail has looped at two checks in
 * a row; a text it passes may still be flagged by the final check, which sees the finished tail.
 */
export class LoopWatch {
  private tail = '';
  private sinceCheck = 0;
  private hits = 0;

  add(piece: string): boolean {
    if (piece === '') return false;
    this.tail += piece;
    // Trimmed at twice the window, so that the copy happens once per RAW_TAIL_CHARS of text.
    if (this.tail.length > 2 * RAW_TAIL_CHARS) this.tail = this.tail.slice(-RAW_TAIL_CHARS);
    this.sinceCheck += piece.length;
    if (this.sinceCheck < STREAM_CHECK_CHARS) return false;
    this.sinceCheck = 0;
    this.hits = isRepetitive(this.tail) ? this.hits + 1 : 0;
    return this.hits >= STREAM_CONFIRMATIONS;
  }
}

/** Length of the longest suffix of `s` that repeats with the given period. */
function periodicSuffixLength(s: string, period: number): number {
  let i = s.length - 1;
  while (i >= period && s.charCodeAt(i) === s.charCodeAt(i - period)) i--;
  return s.length - 1 - i + period;
}

// ---- the gate ----

/** The part of a run the gate reads. */
export type GateInput = {
  status: string;
  statusReason: string | null;
  quality: QualityConfig | null;
  gateOverridden: boolean;
  completed: number;
  flagged: number;
} & Record<FlagCounterKey, number>;

// Every verdict starts with this, so a pause by the gate can be told from a pause by a user.
export const VERDICT_PREFIX = 'quality gate:';

/** The run's gate, or null when quality checks or the gate are off. */
export function gateSettings(r: Pick<GateInput, 'quality'>): GateSettings | null {
  return r.quality?.gate || null;
}

/** Enough samples are done to judge, and the flagged share is above the limit. */
export function overLimit(r: GateInput, gate: GateSettings): boolean {
  // tool_mismatch describes the source data: its lines are left out (a line with another flag as well, at worst, too).
  return r.completed >= gate.min_samples && (r.flagged - r.flagToolMismatch) / r.completed > gate.max_flag_rate;
}

/** Whether the gate pauses this run now: it is dispatching, not overridden, and over its limit. */
export function gateTrips(r: GateInput): boolean {
  const gate = gateSettings(r);
  return gate !== null && !r.gateOverridden && r.status === 'in_progress' && overLimit(r, gate);
}

/** The run is paused by the gate and waits for someone to look (resume, override, retry or cancel). */
export function gateTripped(r: Pick<GateInput, 'status' | 'statusReason'>): boolean {
  return r.status === 'paused' && (r.statusReason?.startsWith(VERDICT_PREFIX) ?? false);
}

// A flag on 3 of 1000 samples reads "<1%", not "0%": it is there, just rare.
export function percent(part: number, whole: number): string {
  const p = (100 * part) / whole;
  return part > 0 && p < 1 ? '<1%' : `${Math.round(p)}%`;
}

/** "quality gate: empty_content 86%, missing_reasoning 86% of 214 samples (flagged 87%, limit 20%)" */
export function gateVerdict(r: GateInput, gate: GateSettings): string {
  const counts: Record<Flag, number> = flagCounts(r);
  const parts = FLAGS.filter((f) => counts[f] > 0)
    .sort((a, b) => counts[b] - counts[a])
    .map((f) => `${f} ${percent(counts[f], r.completed)}`);
  const limit = `${Math.round(1000 * gate.max_flag_rate) / 10}%`;
  return `${VERDICT_PREFIX} ${parts.join(', ')} of ${r.completed} samples (flagged ${percent(r.flagged, r.completed)}, limit ${limit})`;
}

/**
 * A completed run judged as a whole by the gate's rules, whatever its size: the gate waits for
 * `min_samples`, which a run shorter than that never reaches, so without this a run whose every
 * answer was cut would end a plain "completed". With the gate off the default limit judges, for
 * the warning only. Null when the run is within the limit (or its checks are off).
 */
export function endVerdict(r: GateInput): string | null {
  if (!r.quality || r.completed === 0) return null;
  const gate = gateSettings(r) ?? (QUALITY_DEFAULTS.gate as GateSettings);
  if ((r.flagged - r.flagToolMismatch) / r.completed <= gate.max_flag_rate) return null;
  return `completed over the limit: ${gateVerdict(r, gate).slice(VERDICT_PREFIX.length + 1)}`;
}

/** The status reason a completed run ends with: the end verdict, when its gate is on and was not overridden (someone chose to go on past it). */
export function endStatusReason(r: GateInput): string | null {
  return gateSettings(r) === null || r.gateOverridden ? null : endVerdict(r);
}
