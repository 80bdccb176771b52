import type { DbOrTx } from './client.js';

/** Prompt and cached prompt tokens of answers from one endpoint: what a prefix-cache hit rate is read from. */
export interface CacheUsage {
  endpointId: string;
  promptTokens: number;
  cachedTokens: number;
}

const ADD = `insert into run_endpoint_usage (run_id, endpoint_id, prompt_tokens, cached_tokens) values (?, ?, ?, ?)
  on conflict (run_id, endpoint_id) do update set prompt_tokens = run_endpoint_usage.prompt_tokens + excluded.prompt_tokens,
  cached_tokens = run_endpoint_usage.cached_tokens + excluded.cached_tokens`;

/** Adds a batch's answered tokens to each run's counts by endpoint; call inside the batch's transaction. */
export async function addCacheUsage(tx: DbOrTx, runId: string, usage: readonly CacheUsage[]): Promise<void> {
  for (const u of usage) await tx.exec(ADD, [runId, u.endpointId, u.promptTokens, u.cachedTokens]);
}

/** A run's answered prompt and cached tokens by endpoint. */
export async function runCacheUsage(db: DbOrTx, runId: string): Promise<CacheUsage[]> {
  const { rows } = await db.exec<{ endpoint_id: string; prompt_tokens: number | string; cached_tokens: number | string }>(
    'select endpoint_id, prompt_tokens, cached_tokens from run_endpoint_usage where run_id = ? order by endpoint_id',
    [runId],
  );
  return rows.map((r) => ({ endpointId: r.endpoint_id, promptTokens: Number(r.prompt_tokens), cachedTokens: Number(r.cached_tokens) }));
}

/** Every endpoint's answered prompt and cached tokens, over all runs. */
export async function endpointCacheUsage(db: DbOrTx): Promise<CacheUsage[]> {
  const { rows } = await db.exec<{ endpoint_id: string; prompt_tokens: number | string; cached_tokens: number | string }>(
    'select endpoint_id, sum(prompt_tokens) as prompt_tokens, sum(cached_tokens) as cached_tokens from run_endpoint_usage group by endpoint_id order by endpoint_id',
    [],
  );
  return rows.map((r) => ({ endpointId: r.endpoint_id, promptTokens: Number(r.prompt_tokens), cachedTokens: Number(r.cached_tokens) }));
}

/** Cached ÷ prompt tokens, or null before any prompt token. */
export const hitRate = (u: { promptTokens: number; cachedTokens: number }): number | null =>
  u.promptTokens > 0 ? Math.round((u.cachedTokens / u.promptTokens) * 10_000) / 10_000 : null;
