import { afterEach, expect, it } from 'vitest';
import { closeDb, openDb, type Db } from '../../src/db/client.js';
import { balanceEndpoints, beatReplica, leaveReplica, registerReplica, releaseDriver, removeReplicas, readReplicas } from '../../src/db/replicas.js';
import { claimSamples, releaseOrphanLeases } from '../../src/db/samples.js';
import { createTestDatabase, describePg, type TestDatabase } from '../support/pg.js';

// PostgreSQL: how replicas share the endpoints (one driver each, balanced as replicas come and go)
// and which leases go back to the queue when a replica is gone. The end-to-end tests are in
// test/replicas.test.ts; these pin the rules.

const NOW = 1_700_000_000_000;
let db: Db | null = null;
let database: TestDatabase | null = null;

afterEach(async () => {
  if (db) await closeDb(db);
  await database?.drop();
  db = null;
  database = null;
});

async function open(name: string): Promise<Db> {
  database = await createTestDatabase(`share_${name}`);
  db = await openDb(database.url);
  return db;
}

async function addEndpoints(d: Db, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    await d.exec(`insert into endpoints (id, url, name, created_at, updated_at) values (?, ?, ?, ?, ?)`, [
      `ep_${i}`,
      `http://127.0.0.1:${9000 + i}`,
      `e${i}`,
      NOW,
      NOW,
    ]);
  }
}

const join = (d: Db, owner: string) => registerReplica(d, { owner, pid: 1, hostname: 'test' });

/** Each replica balances in turn, handing over at once what it holds past its share, until nothing moves. */
async function settle(d: Db, owners: string[]): Promise<Map<string, string[]>> {
  const held = new Map<string, string[]>();
  for (let round = 0; round < 5; round++) {
    for (const o of owners) {
      const share = await balanceEndpoints(d, o);
      expect(share, `${o} is live`).not.toBeNull();
      for (const id of share!.driven.slice(share!.driven.length - share!.surplus)) await releaseDriver(d, o, id);
      held.set(o, share!.driven.slice(0, share!.driven.length - share!.surplus));
    }
  }
  return held;
}

const sizes = (held: Map<string, string[]>) => [...held.values()].map((ids) => ids.length).sort();

await describePg('replicas sharing endpoints', () => {
  it('each endpoint has one driver, shares differ by one at most, and they move as replicas join and leave', async () => {
    const d = await open('balance');
    await addEndpoints(d, 5);
    await join(d, 'a');
    expect(sizes(await settle(d, ['a']))).toEqual([5]);

    await join(d, 'b');
    await join(d, 'c');
    const three = await settle(d, ['a', 'b', 'c']);
    expect(sizes(three)).toEqual([1, 2, 2]);
    const all = [...three.values()].flat().sort();
    expect(all).toEqual(['ep_0', 'ep_1', 'ep_2', 'ep_3', 'ep_4']);
    const { rows } = await d.exec<{ n: string }>('select count(*) as n from endpoint_drivers');
    expect(Number(rows[0].n)).toBe(5);

    // One leaves: the other two take its endpoints.
    await leaveReplica(d, 'b');
    expect(sizes(await settle(d, ['a', 'c']))).toEqual([2, 3]);

    // One taken for dead: its row goes, and balancing refuses it from then on.
    const seen = (await readReplicas(d)).rows.find((r) => r.owner === 'c')!;
    expect(await removeReplicas(d, [seen])).toEqual(['c']);
    expect(await balanceEndpoints(d, 'c')).toBeNull();
    expect(await beatReplica(d, 'c', { runs: {}, endpoints: {} })).toBe(false);
    expect(sizes(await settle(d, ['a']))).toEqual([5]);
  });

  it('a replica that beat since it was judged keeps its row; a stale one keeps its endpoints until it is removed', async () => {
    const d = await open('stale');
    await addEndpoints(d, 2);
    await join(d, 'a');
    await join(d, 'b');
    await settle(d, ['a', 'b']);
    const judged = (await readReplicas(d)).rows.find((r) => r.owner === 'b')!;
    await new Promise((r) => setTimeout(r, 5));
    expect(await beatReplica(d, 'b', { runs: {}, endpoints: {} })).toBe(true);
    expect(await removeReplicas(d, [judged])).toEqual([]);

    // b's heartbeat 20 s old by the database's clock: only slow, perhaps, and its requests may
    // still run; its endpoint stays its own until the coordinator removes it.
    await d.exec('update replicas set heartbeat_at = heartbeat_at - 20000 where owner = ?', ['b']);
    expect((await balanceEndpoints(d, 'a'))?.driven).toHaveLength(1);
    const stale = (await readReplicas(d)).rows.find((r) => r.owner === 'b')!;
    expect(await removeReplicas(d, [stale])).toEqual(['b']);
    expect((await balanceEndpoints(d, 'a'))?.driven.sort()).toEqual(['ep_0', 'ep_1']);
    expect(await balanceEndpoints(d, 'b')).toBeNull();
  });

  it('only the leases of owners that are no longer replicas go back to the queue', async () => {
    const d = await open('orphans');
    await d.exec(
      `insert into runs (id, model, status, created_at, params, input, shard_size, output_uri, metadata, on_invalid_line, request_timeout_ms, max_attempts, updated_at, total, pending, shards_total)
       values ('run_a', 'm', 'in_progress', ?, '{}', '{"requests":1}', 10, 'file:///tmp/x/', '{}', 'fail', 1000, 5, ?, 9, 9, 1)`,
      [NOW, NOW],
    );
    await d.exec(`insert into shards (run_id, idx, first_seq, sample_count) values ('run_a', 0, 0, 9)`);
    for (let i = 0; i < 9; i++) await d.exec(`insert into samples (run_id, seq, shard_idx, custom_id, request) values ('run_a', ?, 0, ?, '{}')`, [i, `s${i}`]);
    for (const o of ['live', 'gone']) await join(d, o);
    const claim = (owner: string) => claimSamples(d, { runId: 'run_a', owner, now: NOW, leaseExpiresAt: NOW + 1000, limit: 3, order: 'input', window: 0 });
    expect(await claim('live')).toHaveLength(3);
    expect(await claim('gone')).toHaveLength(3);
    await leaveReplica(d, 'gone');
    // A replica gone claims nothing more.
    await expect(claim('gone')).rejects.toThrow(/taken for dead/);

    expect(await releaseOrphanLeases(d, 'run_a')).toBe(3);
    const { rows } = await d.exec<{ owner: string | null; status: string; n: string }>(
      `select lease_owner as owner, status, count(*) as n from samples group by 1, 2 order by 1, 2`,
    );
    expect(rows.map((r) => [r.owner, r.status, Number(r.n)])).toEqual([
      ['live', 'in_progress', 3],
      [null, 'pending', 6],
    ]);
    const run = (await d.exec<{ pending: number; in_progress: number }>('select pending, in_progress from runs')).rows[0];
    expect(run).toEqual({ pending: 6, in_progress: 3 });
    // Nothing more to return.
    expect(await releaseOrphanLeases(d, 'run_a')).toBe(0);
  });
});

await describePg('a claim of a replica of several, under prefix-cache affinity', () => {
  it("leaves a conversation whose prefix sits on another replica's ready endpoint to that one, unless it has waited the driver out and nothing else is due", async () => {
    const d = await open('affinity');
    await addEndpoints(d, 3);
    await d.exec(`update endpoints set state = case id when 'ep_2' then 'unhealthy' else 'ready' end`);
    await d.exec(
      `insert into runs (id, model, status, created_at, params, input, shard_size, output_uri, metadata, on_invalid_line, request_timeout_ms, max_attempts, updated_at, total, pending, shards_total, regenerate)
       values ('run_a', 'm', 'in_progress', ?, '{}', '{"requests":1}', 10, 'file:///tmp/x/', '{}', 'fail', 1000, 5, ?, 5, 5, 1, 'all_assistant')`,
      [NOW, NOW],
    );
    await d.exec(`insert into shards (run_id, idx, first_seq, sample_count) values ('run_a', 0, 0, 5)`);
    // [custom_id, turn, the endpoint holding its prefix, due since (ms before NOW)]
    const samples: [string, number, string | null, number][] = [
      ['mine', 1, 'ep_0', 100],
      ['theirs', 1, 'ep_1', 100],
      ['down', 1, 'ep_2', 100],
      ['waited', 1, 'ep_1', 5000],
      ['new', 0, null, NOW],
    ];
    for (const [i, [id, turn, endpoint, ago]] of samples.entries()) {
      await d.exec(
        `insert into samples (run_id, seq, shard_idx, custom_id, request, turn, affinity_endpoint_id, available_at) values ('run_a', ?, 0, ?, '{}', ?, ?, ?)`,
        [i, id, turn, endpoint, NOW - ago],
      );
    }
    for (const o of ['a', 'b']) await join(d, o);
    const claim = async (owner: string, drives: string[]) =>
      (
        await claimSamples(d, {
          runId: 'run_a',
          owner,
          now: NOW,
          leaseExpiresAt: NOW + 1000,
          limit: 10,
          order: 'input',
          window: 0,
          drives,
          movesAfter: NOW - 2000,
        })
      )
        .map((s) => s.customId)
        .sort();

    // Its own, one whose endpoint is down (it moves, as in one process), and a new one.
    expect(await claim('a', ['ep_0'])).toEqual(['down', 'mine', 'new']);
    // Nothing else due: the one that waited past the affinity wait for its driver moves; the other stays.
    expect(await claim('a', ['ep_0'])).toEqual(['waited']);
    expect(await claim('a', ['ep_0'])).toEqual([]);
    expect(await claim('b', ['ep_1'])).toEqual(['theirs']);
  });
});
