// Quality checks run on every completed sample (DESIGN.md "Quality"). The flags are
// stored as a bitmask, so the order of FLAGS is part of the stored format: append only.
export const FLAGS = ['empty_content', 'missing_reasoning', 'truncated', 'repetitive', 'too_short'] as const;
export type Flag = (typeof FLAGS)[number];

export function flagBit(f: Flag): number {
  return 1 << FLAGS.indexOf(f);
}

export function flagsFromBits(bits: number): Flag[] {
  return FLAGS.filter((f) => (bits & flagBit(f)) !== 0);
}

export function bitsFromFlags(flags: Flag[]): number {
  return flags.reduce((bits, f) => bits | flagBit(f), 0);
}

export interface QualityInput {
  content: string | null;
  reasoning_content: string | null;
  finish_reason: string | null;
  completion_tokens: number;
  thinking_requested: boolean;
}

export interface QualityCheckConfig {
  /** 0 disables the too_short check. */
  min_completion_tokens: number;
}

export function computeFlags(input: QualityInput, cfg: QualityCheckConfig): number {
  const flags: Flag[] = [];
  if (isBlank(input.content)) flags.push('empty_content');
  if (input.thinking_requested && isBlank(input.reasoning_content)) flags.push('missing_reasoning');
  if (input.finish_reason === 'length') flags.push('truncated');
  // A loop in the reasoning matters even when the answer looks fine: it is training data too.
  if (isRepetitive(input.content ?? '') || isRepetitive(input.reasoning_content ?? '')) flags.push('repetitive');
  if (input.completion_tokens < cfg.min_completion_tokens) flags.push('too_short');
  return bitsFromFlags(flags);
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

function normalisedTail(text: string): string {
  const normalised = text.slice(-RAW_TAIL_CHARS).replace(/\s+/g, ' ').trim();
  return normalised.slice(-TAIL_CHARS);
}

/** Length of the longest suffix of `s` that repeats with the given period. */
function periodicSuffixLength(s: string, period: number): number {
  let i = s.length - 1;
  while (i >= period && s.charCodeAt(i) === s.charCodeAt(i - period)) i--;
  return s.length - 1 - i + period;
}

/** Whether the run's params turn on a reasoning model's thinking mode (Qwen3 style). */
export function thinkingRequested(params: Record<string, unknown>): boolean {
  const kwargs = params.chat_template_kwargs;
  if (typeof kwargs !== 'object' || kwargs === null) return false;
  const { enable_thinking, thinking } = kwargs as Record<string, unknown>;
  return enable_thinking === true || thinking === true;
}
