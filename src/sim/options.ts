export interface SimOptions {
  host?: string;
  port?: number;
  model?: string;
  maxRunning?: number;
  maxQueue?: number;
  startupMs?: number;
  ttftMs?: number;
  tokensPerSecond?: number;
  contextLength?: number;
  completionTokens?: number;
  reasoningTokens?: number;
  degenerateRate?: number;
  errorRate?: number;
  resetRate?: number;
  hangRate?: number;
  dieAfter?: number;
  /**
   * 0: off. Chat requests after the holdAfter-th (counted from the start, as `requests`) are
   * counted and then wait, unread and unanswered, until it is raised past them or set to 0: a
   * bench's way to stop a run's progress at a known point, whatever the pace. A drain does not
   * wait for held requests, and a close drops them.
   */
  holdAfter?: number;
  seed?: number;
  /** What `--max-running-requests` SGLang was launched with: only reported (top-level `max_running_requests`); 0 means not given, reported as null. */
  maxRunningRequests?: number;
  /** Data-parallel ranks; `maxRunning` and the queue are split across them. */
  dpSize?: number;
  /** KV pool per DP rank in tokens (`max_total_num_tokens`); 0 means room for every running request at full context, so KV never binds. Fixed at start. */
  kvTokens?: number;
  /**
   * How a KV rank (kvTokens > 0) admits requests. `optimistic`: SGLang's rule, a request joins
   * the batch while new_token_ratio of its max_new_tokens fits in the pool, so a larger client
   * cap only lengthens the queue. `none`: only the running limit (maxRunning split over the DP
   * ranks) is checked, like a server whose advertised limit is far past its KV pool; the
   * overflow is retracted every decode step with its progress lost (re-prefill, regeneration,
   * retractStallMs each), and an over-committed decode step is slowed by asked KV / pool, so a
   * client cap past the pool loses throughput. The overflow is prefilled again on every step,
   * so a prefillTokensPerSecond above 0 turns that slope into a cliff. See KvRank in kv.ts.
   */
  kvAdmission?: 'optimistic' | 'none';
  /** Prefill speed of the KV model: a newly admitted or retracted request stalls its rank for (prompt + generated) / this. 0 is instant. */
  prefillTokensPerSecond?: number;
  /** Each retraction also stalls its rank this long: the cache eviction and re-planning that make a thrashing server slow. */
  retractStallMs?: number;
  /** 0 (off) or 1 (on, like `--enable-metrics`): without it `/metrics` is a 404. */
  enableMetrics?: number;
  /** 0 (off, SGLang's default) or 1 (`--enable-cache-report`): report `prompt_tokens_details.cached_tokens`. */
  enableCacheReport?: number;
  /** 0 (no `--reasoning-parser`: the think block stays in `content`) or 1 (Qwen3 parser). */
  reasoningParser?: number;
  /** 0 (no `--tool-call-parser`: calls are written into `content` as `<tool_call>` text) or 1 (a parser: `tool_calls`, finish_reason "tool_calls"). */
  toolCallParser?: number;
  /** How long `/health` takes to answer; real SGLang runs a one-token generation after sleeping 1 s. */
  healthMs?: number;
  /** Share of chat requests answered HTTP 200 with `finish_reason: "abort"` and the text generated so far. */
  abortRate?: number;
  /** Idle keep-alive sockets are closed after this long (`SGLANG_TIMEOUT_KEEP_ALIVE`). */
  keepAliveMs?: number;
  /**
   * Share of chat requests turned away as the SGLang model gateway sheds load: one sent with
   * `x-smg-priority: bulk` gets 503 with `X-SMG-Preempted`, any other 429 (with `Retry-After`
   * when retryAfterSeconds is above 0).
   */
  turnAwayRate?: number;
  retryAfterSeconds?: number;
  /** 1: a request with `priority` is answered 400 "Priority scheduling is not enabled." (vLLM launched without it). */
  refusePriority?: number;
  /**
   * 1 (`--enable-priority-scheduling`): a rank without a KV model queues by `priority`, then
   * arrival, and a full rank lets a waiting request preempt a running one it outranks by more
   * than prioritySchedulingPreemptionThreshold (src/sim/priority.ts). 0: `priority` is ignored.
   */
  enablePriorityScheduling?: number;
  /** 1 (`--schedule-low-priority-values-first`): the smaller value goes first. */
  scheduleLowPriorityValuesFirst?: number;
  /** `--default-priority-value`: what a request without `priority` gets; null gives it the value that goes last. */
  defaultPriorityValue?: number | null;
  /** `--priority-scheduling-preemption-threshold`: SGLang's default is 10. */
  prioritySchedulingPreemptionThreshold?: number;
  /** 1 (`--disable-priority-preemption`): priority orders the queue only. */
  disablePriorityPreemption?: number;
  /**
   * Which token-id parameters the server knows (docs/sglang.md "Token ids"): `sglext` (current
   * SGLang: `return_token_ids` unstreamed, `return_input_ids`/`return_output_ids` streamed too),
   * `token_ids` (only `return_token_ids` and `return_prompt_token_ids`), `vllm` (vLLM's
   * `return_token_ids`, streamed too), `none` (an older server that ignores them all).
   */
  tokenIdApi?: 'sglext' | 'token_ids' | 'vllm' | 'none';
  /** Share of replies whose first choice's ids are one short of its usage: a server whose ids cannot be trusted. */
  tokenIdMismatchRate?: number;
  /** The embedding model's vector size, when a request asks no `dimensions` (two servers of one model name with different sizes serve two models). */
  embeddingDimensions?: number;
  /**
   * The next this many requests asking for token ids are refused with a 400 naming the parameter,
   * as by a server restarted as a version without it, and then taken again: set at run time.
   */
  refuseIdRequests?: number;
  /**
   * 1: every request asking for token ids on a stream is refused with a 400 naming the parameter,
   * while unstreamed ones (a probe's) are answered: a server, or a proxy before it, that takes the
   * parameters only some ways.
   */
  refuseStreamedIds?: number;
  /** Called when the `dieAfter`-th chat request arrives; by default the server drops every connection and stops listening. */
  onDie?: () => void;
  /** Called with the final stats once a drain has finished the last request, just before the server closes. */
  onDrained?: (stats: object) => void;
}

/** The settings a simulator runs with: every option filled in. */
export type Knobs = Required<Omit<SimOptions, 'onDie' | 'onDrained'>>;

export const DEFAULTS: Readonly<Knobs> = {
  host: '127.0.0.1',
  port: 0,
  model: 'sim-model',
  maxRunning: 64,
  maxQueue: 1024,
  startupMs: 0,
  ttftMs: 0,
  tokensPerSecond: 0,
  contextLength: 32768,
  completionTokens: 64,
  reasoningTokens: 32,
  degenerateRate: 0,
  errorRate: 0,
  resetRate: 0,
  hangRate: 0,
  dieAfter: 0,
  holdAfter: 0,
  seed: 1,
  maxRunningRequests: 0,
  dpSize: 1,
  kvTokens: 0,
  kvAdmission: 'optimistic',
  // Instant, like the rest of the zero-latency default.
  prefillTokensPerSecond: 0,
  retractStallMs: 0,
  // On so that existing callers keep their metrics; real SGLang needs --enable-metrics.
  enableMetrics: 1,
  enableCacheReport: 0,
  reasoningParser: 1,
  toolCallParser: 1,
  // 0 keeps tests fast; real SGLang takes at least 1 s (see docs/sglang.md "Start-up and health").
  healthMs: 0,
  abortRate: 0,
  // SGLANG_TIMEOUT_KEEP_ALIVE's default.
  keepAliveMs: 5000,
  turnAwayRate: 0,
  retryAfterSeconds: 0,
  refusePriority: 0,
  enablePriorityScheduling: 0,
  scheduleLowPriorityValuesFirst: 0,
  defaultPriorityValue: null,
  prioritySchedulingPreemptionThreshold: 10,
  disablePriorityPreemption: 0,
  tokenIdApi: 'sglext',
  tokenIdMismatchRate: 0,
  embeddingDimensions: 32,
  refuseIdRequests: 0,
  refuseStreamedIds: 0,
};

export class SimOptionError extends Error {}

interface Rule {
  expect: string;
  ok: (value: unknown) => boolean;
}

const isNumber = (value: unknown): value is number => typeof value === 'number' && Number.isFinite(value);
const isInteger = (value: unknown): value is number => Number.isInteger(value);

const text: Rule = { expect: 'a non-empty string', ok: (v) => typeof v === 'string' && v.length > 0 };
const rate: Rule = { expect: 'a number from 0 to 1', ok: (v) => isNumber(v) && v >= 0 && v <= 1 };
const duration: Rule = { expect: 'a non-negative number', ok: (v) => isNumber(v) && v >= 0 };
const count: Rule = { expect: 'a non-negative integer', ok: (v) => isInteger(v) && v >= 0 };
const positive: Rule = { expect: 'a positive integer', ok: (v) => isInteger(v) && v > 0 };
const flag: Rule = { expect: '0 or 1', ok: (v) => v === 0 || v === 1 };

const RULES: Record<keyof Knobs, Rule> = {
  host: text,
  port: { expect: 'an integer from 0 to 65535', ok: (v) => isInteger(v) && v >= 0 && v <= 65535 },
  model: text,
  maxRunning: positive,
  maxQueue: count,
  startupMs: duration,
  ttftMs: duration,
  tokensPerSecond: duration,
  contextLength: positive,
  completionTokens: count,
  reasoningTokens: count,
  degenerateRate: rate,
  errorRate: rate,
  resetRate: rate,
  hangRate: rate,
  dieAfter: count,
  holdAfter: count,
  seed: { expect: 'an integer', ok: isInteger },
  maxRunningRequests: count,
  dpSize: positive,
  kvTokens: count,
  kvAdmission: { expect: '"optimistic" or "none"', ok: (v) => v === 'optimistic' || v === 'none' },
  prefillTokensPerSecond: duration,
  retractStallMs: duration,
  enableMetrics: flag,
  enableCacheReport: flag,
  reasoningParser: flag,
  toolCallParser: flag,
  healthMs: duration,
  abortRate: rate,
  keepAliveMs: duration,
  turnAwayRate: rate,
  retryAfterSeconds: count,
  refusePriority: flag,
  enablePriorityScheduling: flag,
  scheduleLowPriorityValuesFirst: flag,
  defaultPriorityValue: { expect: 'an integer or null', ok: (v) => v === null || isInteger(v) },
  prioritySchedulingPreemptionThreshold: { expect: 'an integer', ok: isInteger },
  disablePriorityPreemption: flag,
  tokenIdApi: { expect: '"sglext", "token_ids", "vllm" or "none"', ok: (v) => v === 'sglext' || v === 'token_ids' || v === 'vllm' || v === 'none' },
  tokenIdMismatchRate: rate,
  embeddingDimensions: positive,
  refuseIdRequests: count,
  refuseStreamedIds: flag,
};

export const KNOB_NAMES = Object.keys(RULES) as (keyof Knobs)[];

// The listening address is fixed once the socket is bound, and the ranks and their KV pools once they are built.
const FIXED_AT_START = new Set<string>(['host', 'port', 'dpSize', 'kvTokens']);

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isKnob(key: string): key is keyof Knobs {
  return Object.hasOwn(RULES, key);
}

/** Why `value` is not acceptable for `key` (e.g. "must be a positive integer"), or undefined when it is. */
export function knobProblem(key: keyof Knobs, value: unknown): string | undefined {
  const rule = RULES[key];
  return rule.ok(value) ? undefined : `must be ${rule.expect}`;
}

/** Validates a set of options, at start-up or as a runtime patch; throws SimOptionError naming the first bad one. */
export function checkKnobs(patch: unknown, when: 'start' | 'runtime'): Partial<Knobs> {
  if (!isRecord(patch)) throw new SimOptionError('simulator options must be a JSON object');
  const checked: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === undefined) continue;
    if (!isKnob(key)) throw new SimOptionError(`unknown simulator option "${key}"`);
    if (when === 'runtime' && FIXED_AT_START.has(key)) {
      throw new SimOptionError(`${key} cannot change while the simulator runs`);
    }
    const problem = knobProblem(key, value);
    if (problem) throw new SimOptionError(`${key} ${problem} (got ${JSON.stringify(value)})`);
    checked[key] = value;
  }
  return checked as Partial<Knobs>;
}
