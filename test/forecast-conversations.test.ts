import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer } from './support/server.js';
import { ETA_FLEETS, ETA_POINTS, ETA_TOLERANCE, etaRun, etaSimulator, followEta } from './support/conversation-eta.js';
import { createRun, registerEndpoint } from './support/runner-checks.js';

// A conversation run's ETA on slow simulators: within ±15% of the time the run really took from a
// third and from two thirds of its turns (uneven conversations of 1–6 turns, answers of 20–180
// tokens), on a fleet the conversations queue for and on one where their chains of turns set the
// time. Both sides are measured in the same run, so the machine's load moves them together.

const started: { stop(): Promise<unknown> }[] = [];

describe('the ETA of a conversation run', () => {
  afterAll(async () => {
    await Promise.all(started.map((s) => s.stop()));
  });

  for (const fleet of ETA_FLEETS) {
    it(`is within ±15% of the actual remaining time at a third and two thirds of its turns (${fleet.name})`, async () => {
      const [server, ...sims] = await Promise.all([startTestServer(), spawnSimulator(etaSimulator(fleet)), spawnSimulator(etaSimulator(fleet))]);
      started.push({ stop: () => server.cleanup() }, ...sims.map((s: SimProcess) => ({ stop: () => s.stop() })));
      for (const sim of sims) await registerEndpoint(server.url, sim.url, { max_concurrency: fleet.slots });
      const created = await createRun(server.url, etaRun(fleet));
      const readings = await followEta(async (path) => (await call(server.url, path)).body, created.id);
      expect(readings.map((r, i) => r.at >= ETA_POINTS[i])).toEqual([true, true]);
      for (const r of readings) expect(Math.abs(r.error), JSON.stringify(readings)).toBeLessThanOrEqual(ETA_TOLERANCE);
      // based_on_samples counts the answered turns.
      const done = (await call(server.url, `/v1/runs/${created.id}`)).body;
      expect(done.forecast.based_on_samples).toBeGreaterThan(done.request_counts.completed);
    });
  }
});
