import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, waitFor } from './support/server.js';
import { registerEndpoint } from './support/runner-checks.js';

// An operator's change of an endpoint's state against a probe of a slow /health (docs/sglang.md):
// the probe writes what it learnt only while the endpoint is still in the state it read, a
// conditional update in the store (updateEndpointIfState), so this runs on both stores.

let server: Awaited<ReturnType<typeof startTestServer>>;
let s: SimProcess | undefined;

beforeAll(async () => {
  [server, s] = await Promise.all([startTestServer({ REGEN_LOAD_INTERVAL_MS: '200' }), spawnSimulator({ model: 'm-patch', 'health-ms': 1200 })]);
});

afterAll(async () => {
  await server?.cleanup();
  await s?.stop();
});

describe('regen against real SGLang behaviour', () => {
  it("keeps an operator's state over a probe that was in flight", async () => {
    const sim = s!;
    const ep = await registerEndpoint(server.url, sim.url);
    const stateOf = async () => (await call(server.url, `/v1/endpoints/${ep.id}`)).body.state;
    for (let i = 0; i < 4; i++) {
      expect((await call(server.url, `/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { state: 'ready' } })).status).toBe(200);
      await waitFor('the endpoint to be probed ready', async () => ((await stateOf()) === 'ready' ? true : undefined), 15_000);
      // Probes run back to back (each /health takes 1.2 s, the interval is 0.2 s): one is in flight now.
      await new Promise((r) => setTimeout(r, 300 + i * 250));
      expect((await call(server.url, `/v1/endpoints/${ep.id}`, { method: 'PATCH', json: { state: 'draining' } })).status).toBe(200);
      // Until the /health in flight at the change is answered, then 750 ms for the rest of that probe
      // (/v1/models, /server_info, its conditional write): the least a fixed 1.8 s wait left it.
      const at = await sim.stats();
      await waitFor(
        'the probe in flight to be answered',
        async () => ((await sim.stats()).healthChecks >= at.healthChecks + at.healthRunning ? true : undefined),
        15_000,
        50,
      );
      await new Promise((r) => setTimeout(r, 750));
      expect(await stateOf()).toBe('draining');
    }
  });
});
