import { asc, eq, gt } from 'drizzle-orm';
import type { Db } from './client.js';
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

/** The concurrency the runner uses: the user's setting, else what the server said it runs, else the default. */
export function effectiveConcurrency(e: EndpointRow, fallback: number): number {
  return e.maxConcurrency ?? e.serverMaxRunning ?? fallback;
}

/** Writes what a probe or the dispatcher learnt of an endpoint. */
export function updateEndpoint(db: Db, id: string, set: Partial<EndpointRow>): void {
  db.update(endpoints).set(set).where(eq(endpoints.id, id)).run();
}
