import type { Load, ServerCapacity } from './capacity.js';

// Reading what an SGLang server says of itself (docs/sglang.md): pure parsers of /v1/models,
// /server_info, /v1/loads and /metrics. Each takes what came back and keeps only what it can trust.

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
const positiveInt = (v: unknown): number | null => (typeof v === 'number' && Number.isInteger(v) && v > 0 ? v : null);
const finite = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);

/** `/v1/models`: the served name (`data[0].id`) and the real context length (`max_model_len`). */
export function parseModels(body: unknown): { model: string; maxModelLen: number | null } | null {
  const first = isObject(body) && Array.isArray(body.data) ? body.data[0] : undefined;
  if (!isObject(first) || typeof first.id !== 'string' || first.id === '') return null;
  return { model: first.id, maxModelLen: positiveInt(first.max_model_len) };
}

export interface ServerInfo {
  capacity: ServerCapacity;
  /** When the server process started (epoch seconds): a new value means it restarted. */
  startupTime: number | null;
}

/**
 * `/server_info` (or `/get_server_info`): the running limit is the sum over DP ranks of
 * `internal_states[].effective_max_running_requests_per_dp`; the top-level `max_running_requests`
 * is only the launch flag, null on a default launch, and is used only when the ranks do not say.
 */
export function parseServerInfo(body: unknown): ServerInfo {
  if (!isObject(body)) return { capacity: { maxRunning: null, kvTokens: null }, startupTime: null };
  const states = Array.isArray(body.internal_states) ? body.internal_states : [];
  let perRank = 0;
  let ranks = 0;
  for (const s of states) {
    const v = isObject(s) ? positiveInt(s.effective_max_running_requests_per_dp) : null;
    if (v !== null) {
      perRank += v;
      ranks++;
    }
  }
  const maxRunning = ranks > 0 && ranks === states.length ? perRank : positiveInt(body.max_running_requests);
  return { capacity: { maxRunning, kvTokens: positiveInt(body.max_total_num_tokens) }, startupTime: finite(body.startup_time) };
}

/** A share from 0 to 1, or null: a hit rate past 1 is no reading, and shown as one it would stay on the endpoint and /metrics. */
function rate(v: unknown): number | null {
  const n = finite(v);
  return n !== null && n >= 0 && n <= 1 ? n : null;
}

/** `/v1/loads`: running and waiting requests and KV usage, summed over the DP ranks. */
export function parseLoads(body: unknown, at: number): Load | null {
  const loads = isObject(body) && Array.isArray(body.loads) ? body.loads.filter(isObject) : [];
  if (loads.length === 0) return null;
  let running = 0;
  let waiting = 0;
  let used = 0;
  let total = 0;
  const hits: number[] = [];
  for (const l of loads) {
    const hit = rate(l.cache_hit_rate);
    if (hit !== null) hits.push(hit);
    const r = finite(l.num_running_reqs);
    const w = finite(l.num_waiting_reqs);
    if (r === null || w === null) return null;
    running += r;
    waiting += w;
    const u = finite(l.num_used_tokens);
    const t = finite(l.max_total_num_tokens);
    if (u !== null && t !== null && t > 0) {
      used += u;
      total += t;
    }
  }
  const cacheHitRate = hits.length ? hits.reduce((a, b) => a + b, 0) / hits.length : null;
  return { at, running, waiting, tokenUsage: total > 0 ? used / total : null, retracted: null, cacheHitRate };
}

/** Every series of one metric, summed over its label sets (one per DP rank); null when absent. */
export function metricSum(text: string, name: string): number | null {
  const escaped = name.replace(/[:]/g, '\\:');
  const re = new RegExp(`^${escaped}(?:\\{[^}]*\\})?\\s+([0-9.eE+-]+|NaN)\\s*$`, 'gm');
  let sum: number | null = null;
  for (const m of text.matchAll(re)) {
    const v = Number(m[1]);
    if (Number.isFinite(v)) sum = (sum ?? 0) + v;
  }
  return sum;
}

function metricMean(text: string, name: string): number | null {
  const escaped = name.replace(/[:]/g, '\\:');
  const values = [...text.matchAll(new RegExp(`^${escaped}(?:\\{[^}]*\\})?\\s+([0-9.eE+-]+)\\s*$`, 'gm'))].map((m) => Number(m[1]));
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
}

/**
 * `/metrics` (only with --enable-metrics): the same load, the prefix-cache hit rate
 * (`sglang:cache_hit_rate`, mean over the ranks), and the retractions, which /v1/loads does not give: the counter `sglang:num_retracted_requests_total` where the server has it, and
 * the gauge `sglang:num_retracted_reqs`.
 */
export function parseMetrics(text: string, at: number): Load | null {
  const running = metricSum(text, 'sglang:num_running_reqs');
  const waiting = metricSum(text, 'sglang:num_queue_reqs');
  if (running === null || waiting === null) return null;
  return {
    at,
    running,
    waiting,
    tokenUsage: metricMean(text, 'sglang:token_usage'),
    retracted: metricSum(text, 'sglang:num_retracted_requests_total'),
    retractedNow: metricSum(text, 'sglang:num_retracted_reqs'),
    cacheHitRate: rate(metricMean(text, 'sglang:cache_hit_rate')),
  };
}
