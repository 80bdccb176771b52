import pg from 'pg';
import type { SimProcess } from './sim.js';
import type { FaultRig } from './fault-rig.js';
import { s3ServerEnv } from './fault-rig.js';
import { createTestDatabase, type TestDatabase } from './pg.js';
import { waitFor, type ServerProcess } from './server.js';

// What the replica tests share: `regen serve` processes on one PostgreSQL database and one S3
// store, and the looks they take at the database to see who coordinates and who drives what.

export const REPLICA_BUCKET = 'regen-replicas';

/** The runner role a replica's /metrics names for itself. */
export async function roleOf(base: string): Promise<string | undefined> {
  const text = await (await fetch(`${base}/metrics`)).text();
  return /^regen_replica_info\{[^}]*role="(\w+)"[^}]*\} 1$/m.exec(text)?.[1];
}

async function query<R extends pg.QueryResultRow>(url: string, text: string): Promise<R[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<R>(text)).rows;
  } finally {
    await client.end();
  }
}

/** The pid of the process that holds the runner lock now: the coordinating replica. */
export async function coordinatorPid(url: string): Promise<number | null> {
  return (await query<{ pid: number }>(url, 'select pid from runner_lock where id = 1'))[0]?.pid ?? null;
}

/** The pid of the replica driving each endpoint, by the endpoint's URL. */
export async function driverPids(url: string): Promise<Map<string, number>> {
  const rows = await query<{ url: string; pid: number }>(
    url,
    'select e.url, r.pid from endpoint_drivers d join endpoints e on e.id = d.endpoint_id join replicas r on r.owner = d.owner',
  );
  return new Map(rows.map((r) => [r.url, r.pid]));
}

export const alive = (r: ServerProcess) => r.proc.exitCode === null && r.proc.signalCode === null;

/** Waits until each of `endpoints` is driven by one of `replicas`, and each of those drives one at least. */
export async function waitForSpread(dbUrl: string, endpoints: string[], replicas: ServerProcess[], what: string): Promise<Map<string, number>> {
  const pids = new Set(replicas.map((r) => r.proc.pid));
  return waitFor(
    what,
    async () => {
      const drivers = await driverPids(dbUrl);
      const driving = new Set(drivers.values());
      const spread = endpoints.every((u) => pids.has(drivers.get(u) ?? -1)) && [...pids].every((p) => driving.has(p!) || endpoints.length < pids.size);
      return spread ? drivers : undefined;
    },
    30_000,
    100,
  );
}

/** A replica's environment: state in `database`, output in the rig's S3 store (started on first use). */
export async function replicaEnv(rig: FaultRig, database: TestDatabase, extra: Record<string, string> = {}): Promise<Record<string, string>> {
  const s3 = rig.s3 ?? (await rig.startS3(REPLICA_BUCKET));
  return { ...s3ServerEnv(`http://127.0.0.1:${s3.port}`, REPLICA_BUCKET), REGEN_DATABASE_URL: database.url, ...extra };
}

/**
 * Replicas on the data folders `dirs`, started together, in that order: each spends seconds loading
 * its modules, and replicas starting at once is what a deployment does too (migrations and the
 * runner lock take turns).
 */
export function serveReplicas(rig: FaultRig, dirs: string[], env: Record<string, string>): Promise<ServerProcess[]> {
  return Promise.all(dirs.map((dir) => rig.serve(dir, env)));
}

/** A temp data folder for each of `names`, named `${prefix}-${name}-`. */
export const replicaDirs = (rig: FaultRig, prefix: string, names: string[]): string[] => names.map((name) => rig.dir(`${prefix}-${name}-`));

/** Simulators started together, one for each set of flags. */
export function startSims(rig: FaultRig, flags: Record<string, string | number>[]): Promise<SimProcess[]> {
  return Promise.all(flags.map((f) => rig.sim(f)));
}

/** Databases of their own for a file's tests (empty, or copies of the migrated template: createTestDatabase), dropped after them. */
export function replicaDatabases(): { create(name: string, options?: { migrated?: boolean }): Promise<TestDatabase>; drop(): Promise<void> } {
  const made: TestDatabase[] = [];
  return {
    async create(name, options) {
      const d = await createTestDatabase(name, options);
      made.push(d);
      return d;
    },
    async drop() {
      for (const d of made) await d.drop();
    },
  };
}
