import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, waitFor } from './support/server.js';

type TestServer = Awaited<ReturnType<typeof startTestServer>>;
/** The operator's cap: a hard ceiling, so the caps' sum is known at every moment. */
const CAP = 6;
const SAMPLES = 300;

let server: TestServer;
let sim: SimProcess;

describe('the numbers agree', () => {
  beforeAll(async () => {
    [server, sim] = await Promise.all([startTestServer(), spawnSimulator({ 'max-running': 16, 'ttft-ms': 50, 'tokens-per-second': 400 })]);
    const ep = await call(server.url, '/v1/endpoints', { method: 'POST', json: { url: sim.url, max_concurrency: CAP } });
    expect(ep.status).toBe(201);
  });

  afterAll(async () => {
    await server?.cleanup();
    await sim?.stop();
  });

  it('in flight is requests sent and not answered: never above the caps, the claimed-ahead samples apart', async () => {
    const requests = Array.from({ length: SAMPLES }, (_, i) => ({ custom_id: `n-${i}`, messages: [{ role: 'user', content: `Count ${i}` }] }));
    const created = await call(server.url, '/v1/runs', { method: 'POST', json: { model: 'sim-model', input: { requests }, quality: false } });
    expect(created.status).toBe(201);
    let busiest = 0;
    let claimedAhead = 0;
    let basis = 0;
    await waitFor(
      'the run to complete',
      async () => {
        const r = (await call(server.url, `/v1/runs/${created.body.id}`)).body;
        expect(r.progress.in_flight).toBeLessThanOrEqual(CAP);
        busiest = Math.max(busiest, r.progress.in_flight);
        claimedAhead = Math.max(claimedAhead, r.request_counts.in_progress - r.progress.in_flight);
        // The forecast's basis never shrinks as the run goes.
        if (r.forecast) {
          expect(r.forecast.based_on_samples).toBeGreaterThanOrEqual(basis);
          basis = r.forecast.based_on_samples;
        }
        return r.status === 'completed' ? r : undefined;
      },
      90_000,
      50,
    );
    expect(busiest).toBeGreaterThan(0);
    // What in_progress counts besides: samples claimed and waiting for a slot.
    expect(claimedAhead).toBeGreaterThan(0);
    expect(basis).toBeGreaterThan(0);
  });
});
