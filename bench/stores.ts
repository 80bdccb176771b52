import { join } from 'node:path';
import pg from 'pg';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { CuttingProxy } from '../test/support/faults.js';
import { createTestDatabase, type TestDatabase } from '../test/support/pg.js';
import { spawnServer, tempDir, type ServerProcess } from '../test/support/server.js';
import { regenIngest } from './ingest.js';
import { json, scaled, submitPrompts, until, writePrompts, type Figure } from './support.js';

// SQLite against PostgreSQL, side by side in one run: ingest of one file, and dispatch with one
// replica and with three (each driving its share of the two endpoints: one each for two of them,
// none for the third, which serves the API), and the database round trips a sample costs with each.

const MODEL = 'bench-model';
const SLOTS = 64;

/** Transactions committed in a database so far (an autocommit statement is one): PostgreSQL's own count. */
async function commits(url: string): Promise<number> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    // The statistics a backend collected are flushed at most once a second; the reader asks for a fresh snapshot.
    await client.query('select pg_stat_clear_snapshot()');
    const { rows } = await client.query<{ n: string }>('select xact_commit as n from pg_stat_database where datname = current_database()');
    return Number(rows[0].n);
  } finally {
    await client.end();
  }
}

/** Upload → queued rate of one file on a fresh server. */
async function ingestRate(dataDir: string, file: string, env: Record<string, string>): Promise<number> {
  return (await regenIngest(dataDir, file, env)).rate;
}

/** Samples a second from first dispatch to completion, on `replicas` servers sharing the store. */
async function dispatchRate(dirs: string[], env: Record<string, string>, sims: SimProcess[], n: number): Promise<number> {
  const servers: ServerProcess[] = [];
  try {
    // The replicas start together, as a deployment's do (migrations and secrets queue on advisory
    // locks); the rate is taken from the run's start, after all of them are up.
    const started = await Promise.allSettled(dirs.map((dir) => spawnServer(dir, env)));
    for (const s of started) if (s.status === 'fulfilled') servers.push(s.value);
    const refused = started.find((s) => s.status === 'rejected');
    if (refused) throw refused.reason;
    const [first, ...others] = servers;
    for (const sim of sims) {
      await json(first.url, '/v1/endpoints', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ url: sim.url }) });
    }
    await until(
      'endpoints ready',
      async () => ((await json<{ data: { state: string }[] }>(first.url, '/v1/endpoints')).data.every((e) => e.state === 'ready') ? true : undefined),
      30_000,
    );
    // Created through another replica when there is one: the run reaches the others through the database.
    const runId = await submitPrompts((others[0] ?? first).url, n, { model: MODEL, params: { max_tokens: 256 }, quality: false });
    const done = await until(
      'the run to complete',
      async () => {
        const r = await json<{ status: string; started_at: string; finished_at: string; request_counts: { completed: number } }>(
          first.url,
          `/v1/runs/${runId}`,
        );
        if (['failed', 'cancelled', 'paused'].includes(r.status)) throw new Error(`bench run ended ${r.status}`);
        return r.status === 'completed' ? r : undefined;
      },
      900_000,
    );
    return done.request_counts.completed / ((Date.parse(done.finished_at) - Date.parse(done.started_at)) / 1000);
  } finally {
    await Promise.all(servers.map((s) => s.kill('SIGTERM')));
  }
}

export async function benchStores(): Promise<Figure[]> {
  const lines = scaled(1_000_000, 200);
  const n = scaled(20_000, 100);
  const tmp = tempDir('regen-bench-stores-');
  const databases: TestDatabase[] = [];
  const database = async () => {
    const d = await createTestDatabase('bench');
    databases.push(d);
    return d;
  };
  const sims = await Promise.all([0, 1].map(() => spawnSimulator({ model: MODEL, 'max-running': SLOTS, 'max-queue': 100_000 })));
  try {
    const file = join(tmp.dir, 'prompts.jsonl');
    await writePrompts(file, lines);
    const sqliteIngest = await ingestRate(join(tmp.dir, 'ingest-sqlite'), file, {});
    const pgIngest = await ingestRate(join(tmp.dir, 'ingest-pg'), file, { REGEN_DATABASE_URL: (await database()).url });

    const sqliteDispatch = await dispatchRate([join(tmp.dir, 'd-sqlite')], {}, sims, n);
    const one = await database();
    const before1 = await commits(one.url);
    const pgDispatch = await dispatchRate([join(tmp.dir, 'd-pg1')], { REGEN_DATABASE_URL: one.url }, sims, n);
    const perSample1 = ((await commits(one.url)) - before1) / n;
    const three = await database();
    const before3 = await commits(three.url);
    const pgThree = await dispatchRate(
      ['a', 'b', 'c'].map((r) => join(tmp.dir, `d-pg3-${r}`)),
      { REGEN_DATABASE_URL: three.url },
      sims,
      n,
    );
    const perSample3 = ((await commits(three.url)) - before3) / n;
    // Round trips, counted on the wire by a proxy between the replicas and the database, in runs of
    // their own (the proxy's hop would slow the rates above): from the servers' start to their
    // stop, so migrations, ingest and each replica's heartbeats and balancing count too.
    const roundTrips = async (replicas: string[]) => {
      const d = await database();
      const target = new URL(d.url);
      const proxy = await new CuttingProxy({ host: target.hostname, port: Number(target.port) }).start();
      try {
        target.port = String(proxy.port);
        await dispatchRate(
          replicas.map((r) => join(tmp.dir, `rt-${replicas.length}-${r}`)),
          { REGEN_DATABASE_URL: target.toString() },
          sims,
          n,
        );
        return proxy.roundTrips / n;
      } finally {
        await proxy.close();
      }
    };
    const trips1 = await roundTrips(['a']);
    const trips3 = await roundTrips(['a', 'b', 'c']);
    const part = 'stores';
    const samples = `${n.toLocaleString('en')} samples, 2 zero-latency simulators × ${SLOTS} slots`;
    return [
      {
        part,
        figure: `ingest prompts/s, ${lines.toLocaleString('en')}-line file, upload → queued: PostgreSQL (regen) against SQLite (baseline)`,
        regen: pgIngest,
        baseline: sqliteIngest,
        unit: 'prompts/s',
        ratio: pgIngest / sqliteIngest,
        target: 'reported',
        ok: null,
      },
      {
        part,
        figure: `dispatch samples/s, ${samples}: PostgreSQL, 1 replica (regen) against SQLite (baseline)`,
        regen: pgDispatch,
        baseline: sqliteDispatch,
        unit: 'samples/s',
        ratio: pgDispatch / sqliteDispatch,
        target: 'reported',
        ok: null,
      },
      {
        part,
        figure: `dispatch samples/s, ${samples}: PostgreSQL, 3 replicas (regen) against 1 (baseline)`,
        regen: pgThree,
        baseline: pgDispatch,
        unit: 'samples/s',
        ratio: pgThree / pgDispatch,
        target: 'reported',
        ok: null,
      },
      {
        part,
        figure: 'PostgreSQL transactions per sample (statements outside a transaction count one each), 3 replicas (regen) against 1 (baseline)',
        regen: perSample3,
        baseline: perSample1,
        unit: 'per sample',
        ratio: perSample3 / perSample1,
        target: 'reported',
        ok: null,
      },
      {
        part,
        figure: 'PostgreSQL round trips per sample (a query, or an exchange ended by a Sync, counted on the wire), 3 replicas (regen) against 1 (baseline)',
        regen: trips3,
        baseline: trips1,
        unit: 'per sample',
        ratio: trips3 / trips1,
        target: 'reported',
        ok: null,
      },
    ];
  } finally {
    await Promise.all(sims.map((s) => s.stop()));
    for (const d of databases) await d.drop();
    tmp.cleanup();
  }
}
