import { eq, sql } from 'drizzle-orm';
import type { DbOrTx } from './client.js';
import type { RunRow } from './schema.js';

/** Prompt and cached prompt tokens of answers from one endpoint: what a prefix-cache hit rate is read from. */
export interface CacheUsage {
  endpointId: string;
  promptTokens: number;
  cachedTokens: number;
}

/** Rows added by one statement: 4 parameters each, well inside SQLite's 32,766 and PostgreSQL's 65,535. */
const ROWS_A_STATEMENT = 1000;

const compareRows = (a: { runId: string; endpointId: string }, b: { runId: string; endpointId: string }) =>
  a.runId === b.runId ? compare(a.endpointId, b.endpointId) : compare(a.runId, b.runId);

/**
 * The statement that adds these rows of answered tokens to their runs' counts by endpoint, its rows
 * in key order (within a statement, two writers lock the rows they share in the same order). On
 * PostgreSQL the result writer runs it inside a run's counters update (db/results.ts), not as a
 * round trip of its own.
 */
export function cacheUsageUpsert(rows: readonly (CacheUsage & { runId: string })[]): { sql: string; params: unknown[] } {
  const sorted = [...rows].sort(compareRows);
  return {
    sql: `insert into run_endpoint_usage (run_id, endpoint_id, prompt_tokens, cached_tokens) values ${sorted.map(() => '(?, ?, ?, ?)').join(', ')}
      on conflict (run_id, endpoint_id) do update set prompt_tokens = run_endpoint_usage.prompt_tokens + excluded.prompt_tokens,
      cached_tokens = run_endpoint_usage.cached_tokens + excluded.cached_tokens`,
    params: sorted.flatMap((u) => [u.runId, u.endpointId, u.promptTokens, u.cachedTokens]),
  };
}

/** Adds a batch's answered tokens to each run's counts by endpoint, all runs' in one statement; call inside the batch's transaction. */
export async function addCacheUsage(tx: DbOrTx, usage: ReadonlyMap<string, ReadonlyMap<string, CacheUsage>>): Promise<void> {
  const rows = [...usage].flatMap(([runId, byEndpoint]) => [...byEndpoint.values()].map((u) => ({ runId, ...u })));
  for (let i = 0; i < rows.length; i += ROWS_A_STATEMENT) {
    const { sql: text, params } = cacheUsageUpsert(rows.slice(i, i + ROWS_A_STATEMENT));
    await tx.exec(text, params);
  }
}

const compare = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

/**
 * A run's row and its answered prompt and cached tokens by endpoint (in endpoint order), read in
 * one statement: a client polling a run costs one round trip a read on PostgreSQL.
 */
export async function getRunWithCacheUsage(
  db: DbOrTx,
  id: string,
): Promise<{ run: RunRow; cacheUsage: (CacheUsage & { endpointName: string | null })[] } | undefined> {
  const { runs } = db.t;
  // Each endpoint's row as [endpoint_id, prompt_tokens, cached_tokens, name], aggregated into one JSON array; the
  // name is null once the endpoint is deleted. The name comes from a subquery of its own, not a join: `runs.id`
  // is written unqualified here, and an endpoints table in this scope would capture it.
  const usage =
    db.dialect === 'pg'
      ? sql<unknown>`(select json_agg(json_build_array(u.endpoint_id, u.prompt_tokens, u.cached_tokens, (select e.name from endpoints e where e.id = u.endpoint_id))) from run_endpoint_usage u where u.run_id = ${runs.id})`
      : sql<unknown>`(select json_group_array(json_array(u.endpoint_id, u.prompt_tokens, u.cached_tokens, (select e.name from endpoints e where e.id = u.endpoint_id))) from run_endpoint_usage u where u.run_id = ${runs.id})`;
  const [row] = await db.q.select({ run: runs, usage }).from(runs).where(eq(runs.id, id)).limit(1);
  if (!row) return undefined;
  // node-postgres parses json itself; SQLite hands the text over; PostgreSQL's aggregate of no rows is null.
  const parsed = (typeof row.usage === 'string' ? JSON.parse(row.usage) : (row.usage ?? [])) as [string, number | string, number | string, string | null][];
  const cacheUsage = parsed
    .map(([endpointId, prompt, cached, name]) => ({ endpointId, promptTokens: Number(prompt), cachedTokens: Number(cached), endpointName: name }))
    .sort((a, b) => compare(a.endpointId, b.endpointId));
  return { run: row.run as RunRow, cacheUsage };
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
