import { spawn } from 'node:child_process';
import { once } from 'node:events';
import type { Worker } from 'node:worker_threads';
import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import type { RunnerThread } from '../src/runner/thread.js';
import { Stores } from '../src/storage/index.js';
import {
  checkOutput,
  createRun,
  expectCountersMatchRecount,
  getRun,
  makePrompts,
  registerEndpoint,
  uploadFile,
  waitForStatus,
} from './support/runner-checks.js';
import { call, REGEN, spawnServer, startTestServer, tempDir, waitFor } from './support/server.js';
import { onPg, storeEnv } from './support/store.js';

const TERMINAL = ['completed', 'failed', 'cancelled', 'paused'];
const sims: SimProcess[] = [];
const stores = new Stores({ forcePathStyle: false });

afterAll(async () => {
  await Promise.all(sims.map((s) => s.stop()));
  stores.close();
});

describe('the runner thread', () => {
  it('is started again when it dies mid-run; its leases return and every sample is answered once', async () => {
    const sim = await spawnSimulator({ model: 'm-thread', 'max-running': 16, 'ttft-ms': 150, 'tokens-per-second': 1000 });
    sims.push(sim);
    const server = await startTestServer();
    try {
      await registerEndpoint(server.url, sim.url);
      const prompts = makePrompts(600, 'thread');
      const fileId = await uploadFile(server.url, prompts.jsonl);
      const { id } = await createRun(server.url, { model: 'm-thread', input: { file_id: fileId }, regenerate: 'last_assistant', shard_size: 100 });
      await waitFor('requests in flight', async () => {
        const run = await getRun(server.url, id);
        return run.request_counts.completed >= 50 && run.request_counts.in_progress > 0 ? run : undefined;
      });
      // What an uncaught exception in the thread would do: it ends with requests in flight.
      const thread = server.runner as RunnerThread;
      await (thread as unknown as { worker: Worker }).worker.terminate();
      const atDeath = await sim.stats();
      // The rest need not be slow: what follows proves who answers them and that each is answered once.
      await sim.configure({ ttftMs: 5, tokensPerSecond: 100_000 });

      // The API thread keeps answering while no runner exists.
      expect((await call(server.url, `/v1/runs/${id}`)).status).toBe(200);
      const done = await waitForStatus(server.url, id, TERMINAL);
      expect(done.status).toBe('completed');
      expect(done.request_counts).toMatchObject({ total: 600, completed: 600, failed: 0 });
      // The new thread dispatched: the simulator saw requests after the old one died.
      expect((await sim.stats()).requests).toBeGreaterThan(atDeath.requests);
      const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
      expect(out.lines.size).toBe(600);
      expect(out.errors.size).toBe(0);
      await expectCountersMatchRecount(server.url, done);
      // The new thread's view reaches the API: the endpoint is idle, its latency known.
      const endpoints = (await call(server.url, '/v1/endpoints')).body.data;
      expect(endpoints[0]).toMatchObject({ state: 'ready', in_flight: 0 });
      expect(endpoints[0].stats.p50_latency_ms).toBeGreaterThan(0);
    } finally {
      await server.cleanup();
    }
  });

  it.skipIf(onPg)('refuses to start a second dispatcher on a database another live process dispatches from', async () => {
    const data = tempDir('regen-locked-');
    const first = await spawnServer(data.dir);
    try {
      const second = spawn(process.execPath, [...REGEN, 'serve', '--port', '0', '--data', data.dir], {
        env: { ...process.env, REGEN_LOG_LEVEL: 'info' },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stderr = '';
      second.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
      const [code] = await once(second, 'exit');
      expect(code).toBe(2);
      expect(stderr).toMatch(new RegExp(`another regen process \\(pid ${first.proc.pid} on .+\\) is running dispatch on this database`));
      // The first one is untouched.
      expect((await call(first.url, '/healthz')).status).toBe(200);
    } finally {
      await first.kill('SIGTERM');
      data.cleanup();
    }
  });

  // On PostgreSQL a second process on the database is a replica (README "PostgreSQL and replicas"; test/replicas.test.ts kills the dispatcher).
  it.skipIf(!onPg)('starts a second process on the same PostgreSQL database as a replica that dispatches too and serves the API', async () => {
    const data = tempDir('regen-standby-');
    const first = await spawnServer(data.dir);
    try {
      // Another data folder, the same database.
      const other = tempDir('regen-standby-b-');
      const second = await spawnServer(other.dir, await storeEnv(data.dir));
      try {
        const roleOf = async (base: string) => /^regen_replica_info\{[^}]*role="(\w+)"/m.exec(await (await fetch(`${base}/metrics`)).text())?.[1];
        await waitFor('the second to dispatch', async () => ((await roleOf(second.url)) === 'dispatching' ? true : undefined), 30_000);
        expect(await roleOf(first.url)).toBe('coordinating');
        expect((await call(second.url, '/healthz')).status).toBe(200);
        expect((await call(second.url, '/v1/runs')).status).toBe(200);
        expect((await call(first.url, '/healthz')).status).toBe(200);
      } finally {
        await second.kill('SIGTERM');
        other.cleanup();
      }
    } finally {
      await first.kill('SIGTERM');
      data.cleanup();
    }
  });
});
