import { join } from 'node:path';
import { desc, eq } from 'drizzle-orm';
import { afterAll, describe, expect, it } from 'vitest';
import { closeDb, openDb, sqliteClient } from '../../src/db/client.js';
import { insertEndpoint, listEndpoints } from '../../src/db/endpoints.js';
import { tempDir } from '../support/server.js';

describe('a SQLite connection prepares each statement text once', () => {
  const tmp = tempDir('regen-prepared-');
  const opened: Awaited<ReturnType<typeof openDb>>[] = [];
  afterAll(async () => {
    for (const db of opened) await closeDb(db);
    tmp.cleanup();
  });

  it('hands back the statement it prepared, in the mode a new one has, whatever the caller before it did', async () => {
    const db = await openDb(join(tmp.dir, 'regen.db'));
    opened.push(db);
    const writer = sqliteClient(db);
    const text = 'select 1 as one';
    const first = writer.prepare(text);
    // drizzle asks for arrays on a statement it was given (stmt.raw().all()); the next caller must not get them.
    expect(first.raw().get()).toEqual([1]);
    const second = writer.prepare(text);
    expect(second).toBe(first);
    expect(second.get()).toEqual({ one: 1 });
    // Raw statements through db.exec and drizzle's query builder share the connection's statements and read objects.
    expect((await db.exec<{ one: number }>(text)).rows).toEqual([{ one: 1 }]);
  });

  it('reads rows right through drizzle and db.exec when both run the same text again and again', async () => {
    const db = await openDb(join(tmp.dir, 'regen-2.db'));
    opened.push(db);
    await insertEndpoint(db, { id: 'e1', name: 'one', url: 'http://127.0.0.1:1', createdAt: 1, updatedAt: 1 });
    await insertEndpoint(db, { id: 'e2', name: 'two', url: 'http://127.0.0.1:2', createdAt: 2, updatedAt: 2 });
    const { endpoints } = db.t;
    const query = () =>
      db.q.select({ id: endpoints.id, name: endpoints.name }).from(endpoints).where(eq(endpoints.name, 'two')).orderBy(desc(endpoints.createdAt));
    const built = query().toSQL().sql;
    for (let i = 0; i < 3; i++) {
      expect(await query()).toEqual([{ id: 'e2', name: 'two' }]);
      expect((await db.exec<{ id: string; name: string }>(built, ['two'])).rows).toEqual([{ id: 'e2', name: 'two' }]);
    }
    expect((await listEndpoints(db)).map((e) => e.name).sort()).toEqual(['one', 'two']);
  });
});
