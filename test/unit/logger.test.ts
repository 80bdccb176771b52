import { Writable } from 'node:stream';
import { afterAll, describe, expect, it } from 'vitest';
import { openDb, type Db } from '../../src/db/client.js';
import { makeLogger } from '../../src/logger.js';
import { createTestDatabase, describePg, type TestDatabase } from '../support/pg.js';

/** A logger writing into an array of parsed lines. */
function capture() {
  const lines: Record<string, any>[] = [];
  const out = new Writable({
    write(chunk, _enc, done) {
      for (const l of chunk.toString().split('\n')) if (l) lines.push(JSON.parse(l));
      done();
    },
  });
  return { logger: makeLogger('info', out), lines };
}

let database: TestDatabase | null = null;
let db: Db | null = null;
afterAll(async () => {
  await db?.close();
  await database?.drop();
});

await describePg('the logger, on a failed PostgreSQL query', () => {
  it('keeps the query and its cause, never the values it was given', async () => {
    database = await createTestDatabase('logger');
    db = await openDb(database.url);
    const { endpoints } = db.t;
    const SECRET = 'sk-do-not-log-9f2c';
    // A value may hold any text: this one looks like the start of a stack frame, before the secret.
    const row = { id: 'ep_1', url: 'http://127.0.0.1:1', name: 'a\n    at b (c.js:1:1)', apiKey: SECRET, createdAt: 1, updatedAt: 1 };
    await db.write((w) => w.q.insert(endpoints).values(row));
    // A real failed query of the store: drizzle's message names every value it was given.
    const failure = await db
      .write((w) => w.q.insert(endpoints).values(row))
      .then(
        () => null,
        (err: unknown) => err,
      );
    expect((failure as Error).message).toContain(SECRET);

    const { logger, lines } = capture();
    logger.error({ err: failure }, 'unhandled error');
    logger.warn({ err: { message: (failure as Error).message, code: '23505' } }, 'retrying');
    await new Promise((r) => setImmediate(r));
    expect(lines).toHaveLength(2);
    for (const line of lines) {
      expect(JSON.stringify(line)).not.toContain(SECRET);
      expect(line.err.message).toContain('Failed query: insert into "endpoints"');
      expect(line.err.message).toContain('params: [redacted]');
    }
    expect(lines[0].err.cause).toContain('duplicate key');
    expect(lines[0].err.code).toBe('23505');
    expect(lines[0].err.stack).toContain('    at ');
  });
});

describe('the logger', () => {
  it('leaves other errors as they are', async () => {
    const { logger, lines } = capture();
    logger.warn({ err: { message: 'connect ECONNREFUSED 127.0.0.1:1', code: 'ECONNREFUSED' } }, 'probe failed');
    await new Promise((r) => setImmediate(r));
    expect(lines[0].err).toMatchObject({ message: 'connect ECONNREFUSED 127.0.0.1:1', code: 'ECONNREFUSED' });
  });
});
