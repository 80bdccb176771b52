import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { holdWriteLock, since } from './support/faults.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { onPg } from './support/store.js';
import { checkOutput, createRun, expectCountersMatchRecount, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// Another process takes SQLite's write lock mid-run (BEGIN IMMEDIATE, then sleeps). With a short
// busy_timeout every kind of write fails with SQLITE_BUSY while it is held (result commits, claims,
// status changes, uploads, probes, validation, API writes); with the default 10 s the writes
// first wait (the process stands still: better-sqlite3 waits synchronously) and a lock held
// longer makes one of them fail. Either way: no result lost, no prompt asked twice, no crash.

const sims: SimProcess[] = [];
const servers: ServerProcess[] = [];
const dirs: { cleanup(): void }[] = [];

afterAll(async () => {
  for (const s of servers) await s.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  for (const d of dirs) d.cleanup();
});

const doneOf = (run: any) => run.request_counts.completed + run.request_counts.failed + run.request_counts.cancelled;

async function setup(model: string, samples: number, env: Record<string, string>) {
  const data = tempDir('regen-fault-busy-');
  dirs.push(data);
  const own = [];
  for (const seed of [1, 2]) own.push(await spawnSimulator({ model, 'max-running': 16, 'ttft-ms': 100, 'tokens-per-second': 1000, seed }));
  sims.push(...own);
  const server = await spawnServer(data.dir, env);
  servers.push(server);
  const eps: any[] = [];
  for (const s of own) eps.push(await registerEndpoint(server.url, s.url));
  const prompts = makePrompts(samples, model);
  const fileId = await uploadFile(server.url, prompts.jsonl);
  const { id } = await createRun(server.url, { model, input: { file_id: fileId }, shard_size: 100, regenerate: 'last_assistant' });
  return { data: data.dir, dbPath: join(data.dir, 'regen.db'), server, base: server.url, sims: own, eps, prompts, id };
}

async function waitDone(base: string, id: string, n: number) {
  return waitFor(
    `${n} samples done`,
    async () => {
      const r = (await call(base, `/v1/runs/${id}`)).body;
      return doneOf(r) >= n ? r : undefined;
    },
    90_000,
    50,
  );
}

/** The run completed with every prompt answered once, by one request each, and the process never restarted. */
async function expectIntact(t: Awaited<ReturnType<typeof setup>>, samples: number, pid: number | undefined) {
  const done = await waitForStatus(t.base, t.id, ['completed', 'failed', 'paused', 'cancelled'], 110_000);
  expect(done.status).toBe('completed');
  expect(done.request_counts).toMatchObject({ total: samples, completed: samples, failed: 0 });
  expect(done.shards.uploaded).toBe(done.shards.total);
  expect(t.server.proc.exitCode).toBeNull();
  expect(t.server.proc.pid).toBe(pid);
  const stores = new Stores({ forcePathStyle: false });
  const out = await checkOutput(stores.forUri(done.output_uri), t.prompts.expected);
  stores.close();
  expect(out.lines.size).toBe(samples);
  await expectCountersMatchRecount(t.base, done);
  const requests = (await Promise.all(t.sims.map((s) => s.stats()))).reduce((n, s) => n + s.requests, 0);
  expect(requests).toBe(samples);
  expect(t.server.output()).not.toMatch(/unhandled error|uncaught|ingest crashed/i);
  return done;
}

/** REGEN_DB_BUSY_TIMEOUT_MS's default. */
const DEFAULT_BUSY_TIMEOUT_MS = 10_000;

const busyLines = (log: string) => log.split('\n').filter((l) => /SQLITE_BUSY|database is locked/.test(l));

// SQLite's own write lock: PostgreSQL has no such lock to hold (its faults are a lost connection, tested apart).
// The two tests run at once: each has its own server, simulators and database file, and most of
// their time is locks held and waited out.
describe.skipIf(onPg).concurrent('SQLITE_BUSY from another process holding the write lock', () => {
  it('with a 250 ms busy_timeout: every kind of write fails for 3 s at a time, and is retried', async () => {
    const SAMPLES = 1200;
    const t = await setup('m-busy-short', SAMPLES, { REGEN_DB_BUSY_TIMEOUT_MS: '250' });
    const pid = t.server.proc.pid;
    const locks: { at: number; stalledMs: number; write: number }[] = [];
    for (const fraction of [0.15, 0.35, 0.55]) {
      const before = await waitDone(t.base, t.id, SAMPLES * fraction);
      expect(before.status).toBe('in_progress');
      const lock = holdWriteLock(t.dbPath, 3000);
      await lock.locked;
      const t0 = performance.now();
      // An API write is refused with a 503 problem, a read still answers. The server's own writes
      // stall its event loop for a busy timeout each, so a request may be served only after the
      // lock is gone: ask again until one lands inside the lock.
      let released = false;
      void lock.released.then(() => (released = true));
      let write = await call(t.base, `/v1/endpoints/${t.eps[0].id}`, { method: 'PATCH', json: { weight: 2 } });
      while (write.status === 200 && !released) write = await call(t.base, `/v1/endpoints/${t.eps[0].id}`, { method: 'PATCH', json: { weight: 2 } });
      expect(write.status, JSON.stringify(write.body)).toBe(503);
      expect(write.headers.get('content-type')).toContain('application/problem+json');
      expect(write.body.detail).toBe('the database is busy; try again');
      expect((await call(t.base, `/v1/runs/${t.id}`)).status).toBe(200);
      await lock.released;
      await waitDone(t.base, t.id, doneOf(before) + 100);
      locks.push({ at: doneOf(before), stalledMs: since(t0), write: write.status });
    }

    // A lock taken while another run's 50K-line input is being validated (50 batches of writes, the
    // lock lands between two of them): validation starts over, nothing is doubled.
    const big = Array.from({ length: 50_000 }, (_, i) => JSON.stringify({ id: `b${i}`, prompt: `q${i}` })).join('\n') + '\n';
    const bigFile = await uploadFile(t.base, big);
    const lock = holdWriteLock(t.dbPath, 3000, { onSignal: true });
    await lock.ready;
    const bigRun = await createRun(t.base, { model: 'm-nobody-serves', input: { file_id: bigFile } });
    lock.go();
    await lock.locked;
    expect((await call(t.base, `/v1/runs/${bigRun.id}`)).body.status).toBe('validating');
    await lock.released;
    const queued = await waitForStatus(t.base, bigRun.id, ['queued', 'failed'], 60_000);
    expect(queued.status, queued.status_reason).toBe('queued');
    expect(queued.request_counts).toMatchObject({ total: 50_000, pending: 50_000 });
    expect(queued.shards.total).toBe(50);
    expect((await call(t.base, `/v1/runs/${bigRun.id}/cancel`, { method: 'POST' })).status).toBe(200);

    await expectIntact(t, SAMPLES, pid);
    const log = t.server.output();
    const busy = busyLines(log);
    const sites = [...new Set(busy.map((l) => JSON.parse(l).msg as string))].sort();
    // The failures reached the API and the runner, each retried or refused cleanly. Which of the
    // runner's writes meets a lock (a result commit, a slot refill, validation, a probe) depends on
    // timing; what they must do either way (lose nothing, double nothing) is checked above.
    expect(sites).toContain('database busy; request refused');
    expect(sites.filter((s) => s !== 'database busy; request refused').length).toBeGreaterThan(0);
    console.log('fault-sqlite-busy (250 ms):', JSON.stringify({ samples: SAMPLES, locks, busy_failures: busy.length, sites }));
  });

  it('with the default 10 s busy_timeout: a 4 s lock is waited out, a 13 s one makes a write fail, and nothing is lost', async () => {
    const SAMPLES = 600;
    const t = await setup('m-busy-default', SAMPLES, {});
    const pid = t.server.proc.pid;
    const locks: { ms: number; at: number; stalledMs: number; write: number }[] = [];
    for (const [i, ms] of [4000, 13_000].entries()) {
      const before = await waitDone(t.base, t.id, SAMPLES * (0.2 + 0.3 * i));
      const lock = holdWriteLock(t.dbPath, ms);
      await lock.locked;
      const t0 = performance.now();
      const write = await call(t.base, `/v1/endpoints/${t.eps[0].id}`, { method: 'PATCH', json: { weight: 2 + i } });
      expect([200, 503], JSON.stringify(write.body)).toContain(write.status);
      await lock.released;
      await waitDone(t.base, t.id, doneOf(before) + 100);
      // Shorter than the busy timeout: every write, the API's too, waited it out.
      if (ms < DEFAULT_BUSY_TIMEOUT_MS) {
        expect(write.status, JSON.stringify(write.body)).toBe(200);
        expect(busyLines(t.server.output())).toEqual([]);
      }
      locks.push({ ms, at: doneOf(before), stalledMs: since(t0), write: write.status });
    }
    await expectIntact(t, SAMPLES, pid);
    const busy = busyLines(t.server.output());
    // Past 10 s a write gave up (which one depends on timing) and was retried.
    expect(busy.length).toBeGreaterThan(0);
    console.log(
      'fault-sqlite-busy (10 s):',
      JSON.stringify({ samples: SAMPLES, locks, busy_failures: busy.length, sites: busy.map((l) => JSON.parse(l).msg) }),
    );
  });
});
