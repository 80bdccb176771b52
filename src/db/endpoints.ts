import { and, asc, eq, gt } from 'drizzle-orm';
import type { Db, DbOrTx, Tables } from './client.js';
import type { EndpointRow } from './schema.js';

type EndpointInsert = Tables['endpoints']['$inferInsert'];

// The api_key is sealed on every write and opened on every read of a whole row (`secrets.ts`).
const opened = (db: DbOrTx, row: EndpointRow | undefined) => row && { ...row, apiKey: db.secrets.open(row.apiKey) };
const sealed = <T extends Partial<EndpointInsert>>(db: DbOrTx, set: T): T => ('apiKey' in set ? { ...set, apiKey: db.secrets.seal(set.apiKey) } : set);

export async function getEndpoint(db: Db, id: string): Promise<EndpointRow | undefined> {
  const { endpoints } = db.t;
  const [row] = await db.q.select().from(endpoints).where(eq(endpoints.id, id)).limit(1);
  return opened(db, row);
}

export async function listEndpoints(db: Db, opts: { after?: string; limit: number } = { limit: 10_000 }): Promise<EndpointRow[]> {
  const { endpoints } = db.t;
  const rows = await db.q
    .select()
    .from(endpoints)
    .where(opts.after ? gt(endpoints.id, opts.after) : undefined)
    .orderBy(asc(endpoints.id))
    .limit(opts.limit + 1);
  return rows.map((row) => opened(db, row)!);
}

export async function getEndpointByUrl(db: DbOrTx, url: string): Promise<EndpointRow | undefined> {
  const { endpoints } = db.t;
  const [row] = await db.q.select().from(endpoints).where(eq(endpoints.url, url)).limit(1);
  return opened(db, row);
}

export async function insertEndpoint(db: DbOrTx, row: EndpointInsert): Promise<void> {
  const { endpoints } = db.t;
  await db.write((w) => w.q.insert(endpoints).values(sealed(db, row)));
}

export async function updateEndpoint(db: DbOrTx, id: string, set: Partial<EndpointInsert>): Promise<void> {
  const { endpoints } = db.t;
  await db.write((w) => w.q.update(endpoints).set(sealed(db, set)).where(eq(endpoints.id, id)));
}

export async function deleteEndpoint(db: DbOrTx, id: string): Promise<void> {
  const { endpoints } = db.t;
  await db.write((w) => w.q.delete(endpoints).where(eq(endpoints.id, id)));
}

/** The model and aliases of every registered endpoint; the model is null for one that has not said yet. */
export async function servedModels(db: DbOrTx): Promise<{ model: string | null; aliases: string[] }[]> {
  const { endpoints } = db.t;
  return await db.q.select({ model: endpoints.model, aliases: endpoints.aliases }).from(endpoints);
}

/**
 * Writes what a probe learnt, only while the endpoint is still in the state the probe read: an
 * operator's change made meanwhile wins. Returns whether the write happened.
 */
export async function updateEndpointIfState(db: DbOrTx, id: string, expected: string, set: Partial<EndpointInsert>): Promise<boolean> {
  const { endpoints } = db.t;
  const written = await db.write((w) =>
    w.q
      .update(endpoints)
      .set(sealed(db, set))
      .where(and(eq(endpoints.id, id), eq(endpoints.state, expected)))
      .returning({ id: endpoints.id }),
  );
  return written.length > 0;
}
