import { and, asc, eq, gt } from 'drizzle-orm';
import type { Db, DbOrTx } from './client.js';
import { endpoints, type EndpointRow } from './schema.js';

export function getEndpoint(db: Db, id: string): EndpointRow | undefined {
  return db.select().from(endpoints).where(eq(endpoints.id, id)).get();
}

export function listEndpoints(db: Db, opts: { after?: string; limit: number } = { limit: 10_000 }): EndpointRow[] {
  return db
    .select()
    .from(endpoints)
    .where(opts.after ? gt(endpoints.id, opts.after) : undefined)
    .orderBy(asc(endpoints.id))
    .limit(opts.limit + 1)
    .all();
}

export async function getEndpointByUrl(db: DbOrTx, url: string): Promise<EndpointRow | undefined> {
  const [row] = await db.select().from(endpoints).where(eq(endpoints.url, url)).limit(1);
  return row;
}

export async function insertEndpoint(db: DbOrTx, row: typeof endpoints.$inferInsert): Promise<void> {
  await db.insert(endpoints).values(row);
}

export async function updateEndpoint(db: DbOrTx, id: string, set: Partial<typeof endpoints.$inferInsert>): Promise<void> {
  await db.update(endpoints).set(set).where(eq(endpoints.id, id));
}

export async function deleteEndpoint(db: DbOrTx, id: string): Promise<void> {
  await db.delete(endpoints).where(eq(endpoints.id, id));
}

/** The model and aliases of every registered endpoint; the model is null for one that has not said yet. */
export async function servedModels(db: DbOrTx): Promise<{ model: string | null; aliases: string[] }[]> {
  return await db.select({ model: endpoints.model, aliases: endpoints.aliases }).from(endpoints);
}

/**
 * Writes what a probe learnt, only while the endpoint is still in the state the probe read: an
 * operator's change made meanwhile wins. Returns whether the write happened.
 */
export function updateEndpointIfState(db: DbOrTx, id: string, expected: string, set: Partial<typeof endpoints.$inferInsert>): boolean {
  return (
    db
      .update(endpoints)
      .set(set)
      .where(and(eq(endpoints.id, id), eq(endpoints.state, expected)))
      .run().changes > 0
  );
}
