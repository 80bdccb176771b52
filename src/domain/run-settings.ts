// A run's settings past their validation: the modes and their defaults for runs made before a
// setting existed, how many answers a line asks, and the params a sample is asked with. No zod
// here: the runner thread imports this, and the schemas that validate a run as it is made
// (params.ts, variants.ts) stay on the API thread, a module load the runner thread's start does
// without (test/layout.test.ts).

/**
 * `last_assistant` drops a trailing assistant turn and asks for it again; `all_assistant` drops
 * every assistant turn and asks for each in order, one request a user turn, from the replies
 * regenerated so far (domain/conversation.ts).
 */
export const REGENERATE_MODES = ['last_assistant', 'all_assistant'] as const;
export type RegenerateMode = (typeof REGENERATE_MODES)[number];

/** Which of the source's tool calls a target's call is paired with: the same name at the same place, or the same place. */
export const TOOL_PAIRINGS = ['name', 'position'] as const;
export type ToolPairing = (typeof TOOL_PAIRINGS)[number];
/** What an agentic conversation that cannot be paired becomes: kept up to its last complete user turn, or failed. */
export const TOOL_MISMATCH_ACTIONS = ['truncate', 'fail'] as const;
export type ToolMismatchAction = (typeof TOOL_MISMATCH_ACTIONS)[number];
/** Which assistant messages of the history go back with their reasoning_content: the current tool loop's, all, none. */
export const HISTORY_REASONING = ['loop', 'all', 'none'] as const;
export type HistoryReasoning = (typeof HISTORY_REASONING)[number];

/** A run's stored walk settings, with the defaults for runs made before they existed. */
export function walkSettings(run: { toolPairing?: string | null; historyReasoning?: string | null }): { pairing: ToolPairing; reasoning: HistoryReasoning } {
  return {
    pairing: run.toolPairing === 'position' ? 'position' : 'name',
    reasoning: run.historyReasoning === 'all' || run.historyReasoning === 'none' ? run.historyReasoning : 'loop',
  };
}

/** A run's stored `regenerate`, as a mode. */
export function regenerateMode(stored: string | null): RegenerateMode | null {
  return (REGENERATE_MODES as readonly string[]).includes(stored ?? '') ? (stored as RegenerateMode) : null;
}

/** The order samples are sent in: the input's, or the longest predicted answers first within a window (README, length-aware order). */
export const DISPATCH_ORDERS = ['input', 'length_aware'] as const;
export type DispatchOrder = (typeof DISPATCH_ORDERS)[number];
/** What a line of the input that does not parse does to the run: fails it, or is skipped and counted. */
export const ON_INVALID_LINE = ['fail', 'skip'] as const;
export type OnInvalidLine = (typeof ON_INVALID_LINE)[number];
/** What becomes of an answer cut by max_tokens (finish_reason "length"): kept flagged, asked again with more room, or failed. */
export const ON_LENGTH = ['keep', 'retry', 'fail'] as const;
export type OnLength = (typeof ON_LENGTH)[number];

/** Qwen3-family chat templates think unless told not to (docs/sglang.md "Chat completions"). */
const THINKS_BY_DEFAULT = /qwen3/i;

/**
 * Whether a request asks a reasoning model to think, as SGLang and the Qwen3 templates read it:
 * `chat_template_kwargs.enable_thinking` (or `thinking`) decides when set; else `reasoning_effort`
 * or `reasoning` turn it on; else a Qwen3 model thinks by default.
 */
export function thinkingRequested(params: Record<string, unknown>, model: string): boolean {
  const kwargs = params.chat_template_kwargs;
  if (typeof kwargs === 'object' && kwargs !== null) {
    const { enable_thinking, thinking } = kwargs as Record<string, unknown>;
    if (typeof enable_thinking === 'boolean') return enable_thinking;
    if (typeof thinking === 'boolean') return thinking;
  }
  if (params.reasoning_effort != null || params.reasoning != null) return true;
  return THINKS_BY_DEFAULT.test(model);
}

/** How many samples (answers) a run makes of each input line: its `params.n`, 1 when not set. */
export function samplesPerLine(params: Record<string, unknown>): number {
  const { n } = params;
  return typeof n === 'number' && Number.isInteger(n) && n > 1 ? n : 1;
}

/**
 * Why a run's `params.n` cannot go with its `regenerate` mode, or null when it can. Conversations
 * regenerated turn by turn (`all_assistant`) are refused with n > 1: each of the n answers of a
 * turn would start its own branch, and every later turn of each branch its own request over a
 * prefix no other branch shares, so the cost grows with n × turns and the output is a tree, not
 * n conversations. Run the conversations n times as n runs (with different seeds) instead.
 */
export function samplesPerLineProblem(params: Record<string, unknown> | undefined, regenerate: string | null | undefined): string | null {
  if (samplesPerLine(params ?? {}) === 1 || regenerate !== 'all_assistant') return null;
  return (
    'params.n > 1 cannot go with regenerate: "all_assistant": branching whole conversations would multiply every later ' +
    "turn's prefix by n and give a tree, not n conversations; run the conversations n times as n runs (with different seeds) instead"
  );
}

/**
 * A sample's params: the run's, its variant's over them, its line's own over both.
 * `chat_template_kwargs` is merged one level deep instead of replaced: a variant adding one
 * kwarg must not drop the run's `enable_thinking` (a silent change of the template's mode).
 */
export function layeredParams(
  run: Record<string, unknown>,
  variant: Record<string, unknown> | null | undefined,
  line: Record<string, unknown> | null | undefined,
): Record<string, unknown> {
  if (!variant && !line) return run;
  const params = { ...run, ...variant, ...line };
  const kwargs = [run, variant, line].map((p) => p?.chat_template_kwargs).filter(isRecord);
  if (kwargs.length > 1) params.chat_template_kwargs = Object.fromEntries(kwargs.flatMap((k) => Object.entries(k)));
  return params;
}

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
