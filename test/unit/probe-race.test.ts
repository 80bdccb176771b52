import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { closeDb, openDb } from '../../src/db/client.js';
import { getEndpoint, insertEndpoint, updateEndpoint } from '../../src/db/endpoints.js';
import { makeLogger } from '../../src/logger.js';
import { EndpointProbes } from '../../src/runner/endpoint-probes.js';
import { EndpointPool } from '../../src/runner/endpoints.js';
import { tempDir } from '../support/server.js';

/** An SGLang-like server whose /health answers only when the test says so. */
async function heldHealthServer(model: string) {
  const held: (() => void)[] = [];
  let healthCalls = 0;
  const server: Server = createServer((req, res) => {
    const json = (body: unknown) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    if (req.url === '/health') {
      healthCalls++;
      held.push(() => res.writeHead(200).end());
    } else if (req.url === '/v1/models') json({ data: [{ id: model, max_model_len: 4096 }] });
    else if (req.url === '/server_info')
      json({ max_running_requests: null, internal_states: [{ effective_max_running_requests_per_dp: 8 }], max_total_num_tokens: 1000 });
    else res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    healthCalls: () => healthCalls,
    release: () => {
      for (const answer of held.splice(0)) answer();
    },
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

const settings = {
  probeIntervalMs: 60_000,
  healthTimeoutMs: 10_000,
  unhealthyAfterProbes: 3,
  loadIntervalMs: 60_000,
  sharedLoadIntervalMs: 60_000,
  adaptiveConcurrency: true,
  defaultConcurrency: 32,
  requestRetryMs: 500,
};

/** One endpoint at `url`, `starting`, in a pool on `db`, its first probe under way; returns the pool. */
async function probeOne(db: Awaited<ReturnType<typeof openDb>>, url: string): Promise<EndpointPool> {
  await insertEndpoint(db, { id: 'ep_1', url, name: 'a', state: 'starting', createdAt: 1, updatedAt: 1 });
  const pool = new EndpointPool(
    db,
    makeLogger('silent'),
    Date.now,
    settings,
    () => {},
    () => {},
  );
  await pool.sync();
  new EndpointProbes(
    pool,
    makeLogger('silent'),
    Date.now,
    settings,
    () => {},
    () => {},
  ).due();
  return pool;
}

describe('a probe in flight against an operator', () => {
  const tmp = tempDir();
  afterAll(() => tmp.cleanup());

  /** One endpoint, `starting`, in a pool on a fresh database, with its first probe held at /health. */
  async function probing(model: string, file: string) {
    const fake = await heldHealthServer(model);
    const db = await openDb(join(tmp.dir, file));
    const pool = await probeOne(db, fake.url);
    await expect.poll(() => fake.healthCalls()).toBe(1);
    return { fake, db, pool };
  }

  it('never writes its verdict over a state the operator set while it awaited the server', async () => {
    const { fake, db, pool } = await probing('m', 'race.db');
    try {
      // The API thread's PATCH lands now; the runner thread has not re-read the table yet.
      await updateEndpoint(db, 'ep_1', { state: 'draining' });
      fake.release();
      const e = pool.live.get('ep_1')!;
      await expect.poll(() => e.probing).toBe(false);
      expect((await getEndpoint(db, 'ep_1'))!.state).toBe('draining');
      // The probe read the row again instead: the pool now sees the operator's state.
      expect(e.row.state).toBe('draining');
    } finally {
      await closeDb(db);
      await fake.close();
    }
  });

  it('takes a re-registration stamped before its own verdict, so the endpoint goes back through starting to ready', async () => {
    const { fake, db, pool } = await probing('m', 'reregistered.db');
    try {
      fake.release();
      const e = pool.live.get('ep_1')!;
      await expect.poll(() => e.row.state).toBe('ready');
      // A re-registration that read its clock before the probe's verdict landed writes after it:
      // the row says starting, with an updatedAt older than the pool's.
      await updateEndpoint(db, 'ep_1', { state: 'starting', updatedAt: e.row.updatedAt - 5 });
      // A sync, as every tick makes, takes it for a read older than the verdict and keeps ready.
      await pool.sync();
      expect(e.row.state).toBe('ready');
      // The next probe's verdict, written only over the ready it expects, is refused: the row as it
      // stands is taken, to be probed again at once.
      expect(await pool.setState(e, 'ready', null)).toBe(false);
      expect(e.row.state).toBe('starting');
      expect(e.nextProbeAt).toBe(0);
      // And that probe's verdict lands.
      expect(await pool.setState(e, 'ready', null)).toBe(true);
      expect((await getEndpoint(db, 'ep_1'))!.state).toBe('ready');
    } finally {
      await closeDb(db);
      await fake.close();
    }
  });

  it('still moves an endpoint nobody touched from starting to ready, with what the server said', async () => {
    const { fake, db } = await probing('/models/M', 'plain.db');
    try {
      fake.release();
      await expect.poll(async () => (await getEndpoint(db, 'ep_1'))!.state).toBe('ready');
      expect(await getEndpoint(db, 'ep_1')).toMatchObject({ model: '/models/M', maxModelLen: 4096, serverMaxRunning: 8, kvTokens: 1000 });
    } finally {
      await closeDb(db);
      await fake.close();
    }
  });
});

describe('a probe whose server drops the connection', () => {
  const tmp = tempDir();
  afterAll(() => tmp.cleanup());

  it('says the connection was closed when it drops between /health and /v1/models, never "fetch failed"', async () => {
    // /health answers on a kept-alive connection; /v1/models finds the server gone from it, as
    // when a kill lands between the two requests of one probe.
    const server: Server = createServer((req, res) => {
      if (req.url === '/health') res.writeHead(200).end();
      else req.socket.destroy();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const db = await openDb(join(tmp.dir, 'dropped.db'));
    try {
      await probeOne(db, url);
      await expect.poll(async () => (await getEndpoint(db, 'ep_1'))!.lastError, { timeout: 10_000 }).toBe('connection closed by the server');
    } finally {
      await closeDb(db);
      await new Promise<void>((r) => server.close(() => r()));
    }
  });
});
