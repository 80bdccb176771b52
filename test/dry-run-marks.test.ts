import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { statusCommand } from '../src/cli/status.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, waitFor } from './support/server.js';

type TestServer = Awaited<ReturnType<typeof startTestServer>>;
const TOTAL = 600;
const SLICE = 40;

let server: TestServer;
let sim: SimProcess;

/** What a CLI command printed on stdout. */
async function printed(run: () => Promise<unknown>): Promise<string> {
  let out = '';
  const spy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk) => {
    out += String(chunk);
    return true;
  });
  try {
    await run();
  } finally {
    spy.mockRestore();
  }
  return out;
}

describe('a dry run', () => {
  beforeAll(async () => {
    [server, sim] = await Promise.all([startTestServer(), spawnSimulator({ 'max-running': 16 })]);
    expect((await call(server.url, '/v1/endpoints', { method: 'POST', json: { url: sim.url } })).status).toBe(201);
  });

  afterAll(async () => {
    await server?.cleanup();
    await sim?.stop();
  });

  it('is named, says it is one, and keeps only its slice once its forecast is made', async () => {
    const requests = Array.from({ length: TOTAL }, (_, i) => ({ custom_id: `d-${i}`, messages: [{ role: 'user', content: `Plan ${i}` }] }));
    const created = await call(server.url, '/v1/runs', {
      method: 'POST',
      json: { model: 'sim-model', input: { requests }, dry_run: true, calibration: { samples: SLICE }, shard_size: 100, quality: false },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    expect(created.body).toMatchObject({ name: `dry run of ${TOTAL} inline requests`, dry_run: true });
    const id = created.body.id;
    const run = await waitFor('the dry run to end', async () => {
      const r = (await call(server.url, `/v1/runs/${id}`)).body;
      return r.status === 'completed' ? r : undefined;
    });
    // The counts still add up: the unanswered samples are counted as cancelled, their rows gone.
    expect(run.request_counts).toMatchObject({ total: TOTAL, completed: SLICE, cancelled: TOTAL - SLICE, pending: 0 });
    expect(run.forecast.based_on_samples).toBe(SLICE);
    for (const status of ['pending', 'cancelled']) expect((await call(server.url, `/v1/runs/${id}/samples?status=${status}`)).body.data, status).toEqual([]);
    expect((await call(server.url, `/v1/runs/${id}/samples?limit=1000`)).body.data).toHaveLength(SLICE);

    const table = await printed(() => statusCommand(undefined, { server: server.url }));
    expect(table).toMatch(new RegExp(`${id}\\s+dry run of ${TOTAL} inline requests\\s+completed \\(dry run\\)`));
    expect(await printed(() => statusCommand(id, { server: server.url }))).toContain(`(dry run of ${TOTAL} inline requests), a dry run`);

    // A named one keeps its name.
    const named = await call(server.url, '/v1/runs', {
      method: 'POST',
      json: { name: 'plan-a', model: 'sim-model', input: { requests }, dry_run: true, calibration: { samples: SLICE } },
    });
    expect(named.body.name).toBe('plan-a');
    await call(server.url, `/v1/runs/${named.body.id}/cancel`, { method: 'POST' });
  });
});
