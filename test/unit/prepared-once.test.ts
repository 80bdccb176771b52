import { join } from 'node:path';
import { desc, eq } from 'drizzle-orm';
import { afterAll, describe, expect, it } from 'vitest';
import { closeDb, openDb, sqliteClient } from '../../src/db/client.js';
import { insertEndpoint, listEndpoints } from '../../src/db/endpoints.js';
import { tempDir } from '../support/server.js';

describe('a SQLite connection prepares each query text once', () => {
  const tmp = tempDir('regen-prepared-');
  const opened: Awaited<ReturnType<typeof openDb>>[] = [];
  afterAll(async () => {
    try {
      for (const db of opened) await closeDb(db);
    } finally {
      tmp.cleanup();
    }
  });

  it('hands back the statement it prepared, in the modes a new one has, whatever the caller before it did', async () => {
    const db = await openDb(join(tmp.dir, 'regen.db'));
    opened.push(db);
    const writer = sqliteClient(db);
    const text = 'select 1 as one, 9007199254740993 as big';
    const first = writer.prepare(text);
    // drizzle asks for arrays on a statement it was given (stmt.raw().all()); other callers pluck, or read integers as BigInt.
    expect(first.raw().get()).toEqual([1, 9007199254740992]);
    expect(writer.prepare(text)).toBe(first);
    expect(first.get()).toEqual({ one: 1, big: 9007199254740992 });
    expect(writer.prepare(text).pluck().get()).toBe(1);
    expect(writer.prepare(text).safeIntegers().get()).toEqual({ one: 1n, big: 9007199254740993n });
    expect(writer.prepare(text).get()).toEqual({ one: 1, big: 9007199254740992 });
    // Raw statements through db.exec on the same (writer) connection read objects too.
    expect((await db.write((w) => w.exec<{ one: number }>(text))).rows).toEqual([{ one: 1, big: 9007199254740992 }]);
  });

  it('prepares a pragma anew each time: secure_delete acts when it is prepared, not when it runs', async () => {
    const db = await openDb(join(tmp.dir, 'regen-pragma.db'));
    opened.push(db);
    const writer = sqliteClient(db);
    const secureDelete = () => writer.prepare('pragma secure_delete').pluck().get();
    for (const value of [1, 0, 1, 0]) {
      await db.write((w) => w.exec(`pragma secure_delete = ${value ? 'on' : 'off'}`));
      expect(secureDelete()).toBe(value);
    }
    expect(writer.prepare('pragma secure_delete = on')).not.toBe(writer.prepare('pragma secure_delete = on'));
  });

  it('hands out a new statement while the kept one is still being iterated', async () => {
    const db = await openDb(join(tmp.dir, 'regen-iterate.db'));
    opened.push(db);
    const writer = sqliteClient(db);
    const text = 'select value from json_each(?)';
    const rows: number[] = [];
    for (const row of writer.prepare(text).pluck().iterate('[1,2]')) rows.push(row as number, ...(writer.prepare(text).pluck().all('[10]') as number[]));
    expect(rows).toEqual([1, 10, 2, 10]);
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
