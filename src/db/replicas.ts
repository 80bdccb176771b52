import type { RunnerSnapshot } from '../domain/live-view.js';
import type { Db } from './client.js';

// PostgreSQL only: the replicas of `regen serve` on one database, and which of them drives each
// endpoint. Every replica dispatches; an endpoint is driven by one replica at a time, so its cap
// holds across them all.

/** The database's clock in milliseconds: replicas' own clocks may disagree. */
const NOW = '(extract(epoch from clock_timestamp()) * 1000)::bigint';
/** The advisory lock balancing runs under, so each replica's sees the others' last one whole. */
const BALANCE_LOCK_KEY = 7_240_415;

export interface ReplicaRow {
  owner: string;
  pid: number;
  hostname: string;
  heartbeatAt: number;
  view: RunnerSnapshot | null;
}

type RawReplica = { owner: string; pid: number; hostname: string; heartbeat_at: string; view: RunnerSnapshot | null };

export async function registerReplica(db: Db, r: { owner: string; pid: number; hostname: string }): Promise<void> {
  await db.exec(`insert into replicas (owner, pid, hostname, heartbeat_at) values (?, ?, ?, ${NOW})`, [r.owner, r.pid, r.hostname]);
}

/**
 * Renews a replica's heartbeat and publishes its live view. False once its row is gone: the
 * coordinator took it for dead and gave its leases and endpoints to others, so it must stop.
 */
export async function beatReplica(db: Db, owner: string, view: RunnerSnapshot): Promise<boolean> {
  const { changes } = await db.exec(`update replicas set heartbeat_at = ${NOW}, view = ?::jsonb where owner = ?`, [JSON.stringify(view), owner]);
  return changes > 0;
}

/** A replica that stops: its endpoints go to the others at their next balance. */
export async function leaveReplica(db: Db, owner: string): Promise<void> {
  await db.tx(async (tx) => {
    await tx.exec('delete from endpoint_drivers where owner = ?', [owner]);
    await tx.exec('delete from replicas where owner = ?', [owner]);
  });
}

/** Every registered replica, and the database's time of the read. */
export async function readReplicas(db: Db): Promise<{ rows: ReplicaRow[]; now: number }> {
  const { rows } = await db.exec<RawReplica & { now: string }>(`select owner, pid, hostname, heartbeat_at, view, ${NOW} as now from replicas order by owner`);
  const now = rows.length ? Number(rows[0].now) : 0;
  return {
    rows: rows.map((r) => ({ owner: r.owner, pid: r.pid, hostname: r.hostname, heartbeatAt: Number(r.heartbeat_at), view: r.view })),
    now,
  };
}

/**
 * Removes replicas taken for dead, with the endpoints they drove, unless one beat since it was
 * judged (its heartbeat moved): a replica that was only slow keeps its row. Returns the owners removed.
 */
export async function removeReplicas(db: Db, dead: readonly Pick<ReplicaRow, 'owner' | 'heartbeatAt'>[]): Promise<string[]> {
  if (!dead.length) return [];
  return db.tx(async (tx) => {
    const removed: string[] = [];
    for (const r of dead) {
      const { changes } = await tx.exec('delete from replicas where owner = ? and heartbeat_at = ?', [r.owner, r.heartbeatAt]);
      if (changes) removed.push(r.owner);
    }
    if (removed.length) await tx.exec('delete from endpoint_drivers where owner = any(?)', [removed]);
    return removed;
  });
}

/**
 * One replica's share of the endpoints, decided under an advisory lock so the replicas take turns:
 * with E endpoints and R registered replicas each drives ⌊E/R⌋ or ⌈E/R⌉, the larger shares going to
 * those that hold more already (then by owner), so a share moves only when the count of replicas
 * or endpoints changes. An endpoint whose driver is gone is free. Takes free endpoints up
 * to the share at once; returns what the replica drives now and how many it holds past its share,
 * which it hands over once their requests have finished (`releaseDriver`). Null when the replica's
 * row was removed (it was taken for dead): it must stop.
 */
export async function balanceEndpoints(db: Db, owner: string): Promise<{ driven: string[]; surplus: number } | null> {
  return db.tx(async (tx) => {
    await tx.exec('select pg_advisory_xact_lock(?)', [BALANCE_LOCK_KEY]);
    // Every registered replica, however stale: only the coordinator's removal frees a replica's
    // endpoints (removeReplicas), once it has judged it dead. Taken here from one that is only
    // slow, an endpoint would run its requests and the new driver's at once.
    const registered = (await tx.exec<{ owner: string }>('select owner from replicas order by owner')).rows.map((r) => r.owner);
    if (!registered.includes(owner)) return null;
    const endpoints = (await tx.exec<{ id: string }>('select id from endpoints order by id')).rows.map((r) => r.id);
    const drivers = (await tx.exec<{ endpoint_id: string; owner: string }>('select endpoint_id, owner from endpoint_drivers')).rows;
    const liveSet = new Set(registered);
    const orphaned = drivers.filter((d) => !liveSet.has(d.owner)).map((d) => d.endpoint_id);
    if (orphaned.length) await tx.exec('delete from endpoint_drivers where endpoint_id = any(?)', [orphaned]);
    const held = new Map<string, string[]>(registered.map((o) => [o, []]));
    for (const d of drivers) held.get(d.owner)?.push(d.endpoint_id);
    const order = [...registered].sort((a, b) => held.get(b)!.length - held.get(a)!.length || (a < b ? -1 : 1));
    const rank = order.indexOf(owner);
    const share = Math.floor(endpoints.length / registered.length) + (rank < endpoints.length % registered.length ? 1 : 0);
    const mine = held.get(owner)!;
    const taken = new Set(drivers.filter((d) => liveSet.has(d.owner)).map((d) => d.endpoint_id));
    for (const id of endpoints) {
      if (mine.length >= share) break;
      if (taken.has(id)) continue;
      await tx.exec(`insert into endpoint_drivers (endpoint_id, owner, since) values (?, ?, ${NOW})`, [id, owner]);
      mine.push(id);
    }
    return { driven: mine, surplus: Math.max(0, mine.length - share) };
  });
}

/** Hands an endpoint over: the next balance of a replica under its share takes it. */
export async function releaseDriver(db: Db, owner: string, endpointId: string): Promise<void> {
  await db.exec('delete from endpoint_drivers where endpoint_id = ? and owner = ?', [endpointId, owner]);
}
