import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { closeDb, openDb } from '../../src/db/client.js';
import { getEndpoint, insertEndpoint } from '../../src/db/endpoints.js';
import { makeLogger } from '../../src/logger.js';
import { EndpointProbes } from '../../src/runner/endpoint-probes.js';
import { EndpointPool } from '../../src/runner/endpoints.js';
import { tempDir } from '../support/server.js';

const PROBE_INTERVAL_MS = 5000;
/** Longer than any wait the probes ever took between two looks at a dead server. */
const LONG_DOWN_STEP_MS = 61_000;

const settings = {
  probeIntervalMs: PROBE_INTERVAL_MS,
  healthTimeoutMs: 10_000,
  unhealthyAfterProbes: 3,
  loadIntervalMs: 3_600_000,
  sharedLoadIntervalMs: 3_600_000,
  adaptiveConcurrency: false,
  defaultConcurrency: 8,
  requestRetryMs: 500,
};

/** A healthy SGLang-like server on `port` (0: any free one). */
async function healthyServer(port = 0): Promise<Server> {
  const server = createServer((req, res) => {
    const json = (body: unknown) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    if (req.url === '/health') res.writeHead(200).end();
    else if (req.url === '/v1/models') json({ data: [{ id: 'm', max_model_len: 4096 }] });
    else res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(port, '127.0.0.1', () => r()));
  return server;
}

function kill(server: Server): Promise<void> {
  server.closeAllConnections();
  return new Promise((r) => server.close(() => r()));
}

describe('an endpoint whose server went away', () => {
  const tmp = tempDir();
  afterAll(() => tmp.cleanup());

  it('is probed every interval however long it was down, so a restarted server is back within one', async () => {
    let server = await healthyServer();
    const port = (server.address() as AddressInfo).port;
    const db = await openDb(join(tmp.dir, 'probe-interval.db'));
    // The probes' clock is the test's: minutes of downtime pass in a few loopback round trips.
    let now = 1_000_000;
    const clock = () => now;
    try {
      await insertEndpoint(db, { id: 'ep_1', url: `http://127.0.0.1:${port}`, name: 'a', state: 'starting', createdAt: 1, updatedAt: 1 });
      const pool = new EndpointPool(
        db,
        makeLogger('silent'),
        clock,
        settings,
        () => {},
        () => {},
      );
      const probes = new EndpointProbes(
        pool,
        makeLogger('silent'),
        clock,
        settings,
        () => {},
        () => {},
      );
      await pool.sync();
      const e = pool.live.get('ep_1')!;
      /** One look of the probes at the pool, `step` after the last, and its probe (if one was due) over. */
      const look = async (step: number) => {
        now += step;
        probes.due();
        await expect.poll(() => e.probing).toBe(false);
      };
      await look(0);
      expect(e.dispatchable).toBe(true);

      await kill(server);
      for (let i = 0; i < 6; i++) await look(LONG_DOWN_STEP_MS);
      expect((await getEndpoint(db, 'ep_1'))!.state).toBe('unhealthy');
      expect(e.dispatchable).toBe(false);

      server = await healthyServer(port);
      await look(PROBE_INTERVAL_MS);
      expect((await getEndpoint(db, 'ep_1'))!.state).toBe('ready');
      expect(e.dispatchable).toBe(true);
    } finally {
      await closeDb(db);
      await kill(server);
    }
  });
});
