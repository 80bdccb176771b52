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

export function getEndpointByUrl(db: DbOrTx, url: string): EndpointRow | undefined {
  return db.select().from(endpoints).where(eq(endpoints.url, url)).get();
}

export function insertEndpoint(db: DbOrTx, row: typeof endpoints.$inferInsert): void {
  db.insert(endpoints).values(row).run();
}

export function updateEndpoint(db: DbOrTx, id: string, set: Partial<typeof endpoints.$inferInsert>): void {
  db.update(endpoints).set(set).where(eq(endpoints.id, id)).run();
}

export function deleteEndpoint(db: DbOrTx, id: string): void {
  db.delete(endpoints).where(eq(endpoints.id, id)).run();
}

/** The model and aliases of every registered endpoint; the model is null for one that has not said yet. */
export function servedModels(db: DbOrTx): { model: string | null; aliases: string[] }[] {
  return db.select({ model: endpoints.model, aliases: endpoints.aliases }).from(endpoints).all();
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
