import pg from 'pg';
import { afterAll, expect, it } from 'vitest';
import { isDbBusy, openDb, type Db } from '../src/db/client.js';
import { readRunnerLock } from '../src/db/runner-lock.js';
import { RunnerLock } from '../src/runner/lock.js';
import { CuttingProxy, since } from './support/faults.js';
import { doneOf, faultRig, readOutput, waitForEnd, waitForReadyz, waitForRun } from './support/fault-rig.js';
import { createTestDatabase, describePg, type TestDatabase } from './support/pg.js';
import { createRun, expectCountersMatchRecount, makePrompts, registerEndpoint, uploadFile, type Prompts } from './support/runner-checks.js';
import { call, type ServerProcess } from './support/server.js';

// The PostgreSQL store under what a stalled or cut-off process does to it: a connection the server
// ends while regen holds it, and a lock row another process keeps locked.

/** The runner lock's staleness (REGEN_REPLICA_STALE_MS's default): the takeover here is the same process's, taken at once whatever it is. */
const STALE_MS = 15_000;
const rig = faultRig();
const databases: TestDatabase[] = [];
const opened: Db[] = [];
const clients: pg.Client[] = [];
const proxies: CuttingProxy[] = [];
afterAll(async () => {
  await rig.stop();
  for (const c of clients) await c.end().catch(() => {});
  for (const p of proxies) await p.close();
  for (const db of opened) await db.close();
  for (const d of databases) await d.drop();
});

// The databases are copies of the migrated template: what is tested here is a store already in use.
async function store(name: string): Promise<{ db: Db; url: string }> {
  const database = await createTestDatabase(name, { migrated: true });
  databases.push(database);
  const db = await openDb(database.url);
  opened.push(db);
  return { db, url: database.url };
}

async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

async function client(url: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url });
  // A connection these tests cut or end reports it here, not as an exception nobody catches.
  c.on('error', () => {});
  await c.connect();
  clients.push(c);
  return c;
}

/** The database's clock, in milliseconds since the epoch. */
async function dbNow(c: pg.Client): Promise<number> {
  const { rows } = await c.query<{ now: string }>('select (extract(epoch from clock_timestamp()) * 1000)::bigint as now');
  return Number(rows[0].now);
}

/** A test database behind a proxy that can cut it off; `url` goes through the proxy, `port` is the server's own. */
async function proxiedDatabase(name: string): Promise<{ proxy: CuttingProxy; url: string; port: string }> {
  const database = await createTestDatabase(name, { migrated: true });
  databases.push(database);
  const through = new URL(database.url);
  const port = through.port;
  const proxy = await new CuttingProxy({ host: through.hostname, port: Number(port) }).start();
  proxies.push(proxy);
  through.port = String(proxy.port);
  return { proxy, url: through.toString(), port };
}

/** A server on a proxied database, running `samples` prompts on one simulator (cap 8), once `fraction` of them are done. */
async function proxiedRun(name: string, samples: number, seed: number, fraction: number) {
  const { proxy, url, port } = await proxiedDatabase(`pgconn_${name.replace(/-/g, '_')}`);
  const sim = await rig.sim({ 'max-running': 64, 'ttft-ms': 50, 'tokens-per-second': 2000, seed });
  const server = await rig.serve(rig.dir(`regen-pg-${name}-`), { REGEN_DATABASE_URL: url });
  const prompts = makePrompts(samples, name);
  await registerEndpoint(server.url, sim.url, { max_concurrency: 8 });
  const { id } = await createRun(server.url, {
    model: 'sim-model',
    input: { file_id: await uploadFile(server.url, prompts.jsonl) },
    shard_size: 100,
    regenerate: 'last_assistant',
  });
  await waitForRun(server.url, id, `${fraction * 100}% done`, (r) => doneOf(r) >= fraction * samples, 120_000, 50);
  return { proxy, port, sim, server, prompts, id };
}

/** The run completed with each prompt answered once, and the runner thread never restarted. */
async function expectWhole(server: ServerProcess, id: string, prompts: Prompts, samples: number, ms: number): Promise<void> {
  const done = await waitForEnd(server.url, id, ms);
  expect(done.status, done.status_reason).toBe('completed');
  expect(done.request_counts).toMatchObject({ total: samples, completed: samples, failed: 0 });
  await expectCountersMatchRecount(server.url, done);
  const out = await readOutput(done, prompts);
  expect(out.lines.size).toBe(samples);
  expect(server.output()).not.toContain('the runner thread stopped unexpectedly');
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
    // And it fails as a database that may answer again (the API's 503, a validation tried again),
    // not as the step's own fault.
    const err = await failed.then(
      () => null,
      (e: unknown) => e,
    );
    expect(err, 'the transaction failed').not.toBeNull();
    expect(isDbBusy(err), String(err)).toBe(true);
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
    const first = new RunnerLock(db, 'owner-a', Date.now, STALE_MS);
    await first.take();
    // A stalled transaction of the holder: the lock row held shared, left open.
    const staller = await client(url);
    await staller.query('begin');
    await staller.query('select owner from runner_lock where id = 1 for share');
    const admin = await client(url);
    // The same process takes its own lock over at once (a restarted runner thread), whatever the heartbeat.
    const second = new RunnerLock(db, 'owner-b', Date.now, STALE_MS);
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

  it("the proxy in front of the database counts its clients' round trips (the bench's figure)", async () => {
    const { proxy, url } = await proxiedDatabase('pgconn_count');
    const c = await client(url);
    const before = proxy.roundTrips;
    await c.query('select 1');
    // Parameters: parse, bind, describe, execute and sync, sent at once: one round trip.
    await c.query('select $1::text as a', ['x'.repeat(200_000)]);
    await c.query('begin');
    await c.query('select $1::int as b', [2]);
    await c.query('commit');
    expect(proxy.roundTrips - before).toBe(5);
    await c.end();
  });

  it('a claim the database made whose answer was lost (a failover at its commit) is dispatched, not left leased', async () => {
    const SAMPLES = 400;
    const { proxy, sim, server, prompts, id } = await proxiedRun('lost-claim', SAMPLES, 12, 0.1);
    // The claim's statement (src/db/samples.ts): its samples are leased, and the runner hears nothing back.
    await withTimeout(proxy.loseCommitOf("status = 'in_progress', attempts = attempts + 1"), 30_000, 'a claim to commit');
    await new Promise((r) => setTimeout(r, 1000));
    proxy.restore();

    // Leases are never given back by expiry: a claim taken for failed would hold its samples until a restart.
    await expectWhole(server, id, prompts, SAMPLES, 60_000);
    // The trap took a claim the runner saw fail; its samples were sent once, not again.
    expect(server.output()).toContain('claiming samples failed');
    expect((await sim.stats()).requests).toBe(SAMPLES);
  }, 180_000);

  it('a database that goes away mid-run and comes back (a failover) loses and duplicates nothing', async () => {
    const SAMPLES = 1500;
    const OUTAGE_MS = 6000;
    const { proxy, port, server, prompts, id } = await proxiedRun('outage', SAMPLES, 11, 0.3);

    proxy.cut();
    const t0 = performance.now();
    // Not ready, and the API says the database is unavailable: a 503 problem, not a 500.
    const down = await waitForReadyz(server.url, 503, 20_000);
    expect(down.body.checks.database).toBe('unavailable');
    const read = await call(server.url, `/v1/runs/${id}`);
    expect(read.status, JSON.stringify(read.body)).toBe(503);
    expect(read.headers.get('content-type')).toContain('application/problem+json');
    expect(JSON.stringify(read.body)).not.toContain(port);
    await new Promise((r) => setTimeout(r, Math.max(0, OUTAGE_MS - since(t0))));
    proxy.restore();

    await waitForReadyz(server.url, 200, 30_000);
    // The runner thread was never restarted: the outage was weathered, not crashed through.
    await expectWhole(server, id, prompts, SAMPLES, 180_000);
    expect(server.proc.exitCode, 'the server lived through the outage').toBeNull();
  }, 300_000);
});
