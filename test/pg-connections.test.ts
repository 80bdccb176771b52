import pg from 'pg';
import { afterAll, expect, it } from 'vitest';
import { openDb, type Db } from '../src/db/client.js';
import { readRunnerLock } from '../src/db/runner-lock.js';
import { RunnerLock } from '../src/runner/lock.js';
import { createTestDatabase, describePg, type TestDatabase } from './support/pg.js';

// The PostgreSQL store under what a stalled or cut-off process does to it: a connection the server
// ends while regen holds it, and a lock row another process keeps locked.

const databases: TestDatabase[] = [];
const opened: Db[] = [];
const clients: pg.Client[] = [];
afterAll(async () => {
  for (const c of clients) await c.end().catch(() => {});
  for (const db of opened) await db.close();
  for (const d of databases) await d.drop();
});

async function store(name: string): Promise<{ db: Db; url: string }> {
  const database = await createTestDatabase(name);
  databases.push(database);
  const db = await openDb(database.url);
  opened.push(db);
  return { db, url: database.url };
}

async function client(url: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  clients.push(c);
  return c;
}

/** The database's clock, in milliseconds since the epoch. */
async function dbNow(c: pg.Client): Promise<number> {
  const { rows } = await c.query<{ now: string }>('select (extract(epoch from clock_timestamp()) * 1000)::bigint as now');
  return Number(rows[0].now);
}

await describePg('the PostgreSQL store under stalled and cut-off connections', () => {
  it('a transaction whose connection the server ends fails as an error, and the process goes on', async () => {
    const { db, url } = await store('pgconn_tx');
    const admin = await client(url);
    const failed = db.tx(async (tx) => {
      const { rows } = await tx.exec<{ pid: number }>('select pg_backend_pid() as pid');
      await admin.query('select pg_terminate_backend($1)', [rows[0].pid]);
      // Idle in the transaction while the server ends it: an 'error' event with nobody listening
      // would end this process here.
      await new Promise((r) => setTimeout(r, 300));
      await tx.exec('select 1');
    });
    await expect(failed).rejects.toThrow();
    // The broken connection was dropped, not handed out again: the next ten all work.
    for (let i = 0; i < 10; i++) expect((await db.tx((tx) => tx.exec<{ one: number }>('select 1 as one'))).rows[0].one).toBe(1);
  });

  it('a hold whose connection the server ends releases without throwing, and the name can be held again', async () => {
    const { db, url } = await store('pgconn_hold');
    const admin = await client(url);
    const hold = await db.hold('regen:test:hold');
    expect(hold).not.toBeNull();
    const { rows } = await admin.query<{ pid: number }>(
      "select pid from pg_locks where locktype = 'advisory' and granted and database = (select oid from pg_database where datname = current_database())",
    );
    expect(rows).toHaveLength(1);
    await admin.query('select pg_terminate_backend($1)', [rows[0].pid]);
    await new Promise((r) => setTimeout(r, 300));
    await hold!.release();
    const again = await db.hold('regen:test:hold');
    expect(again).not.toBeNull();
    await again!.release();
  });

  it('a takeover that waited on the lock row writes a heartbeat as of the take, not as of its wait', async () => {
    const { db, url } = await store('pgconn_lock');
    const first = new RunnerLock(db, 'owner-a', Date.now);
    await first.take();
    // A stalled claim of the holder: the lock row held shared by a transaction left open.
    const staller = await client(url);
    await staller.query('begin');
    await staller.query('select owner from runner_lock where id = 1 for share');
    const admin = await client(url);
    // The same process takes its own lock over at once (a restarted runner thread), whatever the heartbeat.
    const second = new RunnerLock(db, 'owner-b', Date.now);
    const taking = second.take();
    const WAIT_MS = 1500;
    await new Promise((r) => setTimeout(r, WAIT_MS));
    const releasedAt = await dbNow(admin);
    await staller.query('commit');
    await taking;
    const lock = await readRunnerLock(db);
    expect(lock?.owner).toBe('owner-b');
    // Written once the row was free: within the moments after the release, not WAIT_MS before it.
    expect(lock!.heartbeatAt).toBeGreaterThanOrEqual(releasedAt);
  });
});
