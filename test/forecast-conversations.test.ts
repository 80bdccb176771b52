import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer } from './support/server.js';
import { ETA_FLEETS, ETA_POINTS, type EtaReading, etaRun, etaSimulator, followEta } from './support/conversation-eta.js';
import { createRun, registerEndpoint } from './support/runner-checks.js';

// A conversation run's ETA on slow simulators, read at a third and at two thirds of its turns
// (uneven conversations of 1–6 turns, answers of 20–180 tokens), on a fleet the conversations queue
// for and on one where their chains of turns set the time: at both points it is of the time the run
// really took from there (on the chains fleet the time left falls little between the two, so the
// ETA need not fall either). The ±15% goal is the bench's (`npm run bench
// conversation-eta`): the forecast's speed is measured from earlier answers, so a machine whose load
// changes during the run (this suite's) moves the error either way. What this test holds under any
// load is the difference from the forecasts before: the one that counted conversations left, not
// turns, said 2 s on the chains fleet where 17 s were left (−88%).

/**
 * Far from the forecasts before the dispatch was played forward (turns counted as conversations:
 * −76% and −88%), wide enough for a loaded machine. Read at one instant, the ETA at two thirds of
 * the chains fleet's turns ran long under this suite's load: +16% and +28% in the two projects of
 * one run, +59% and +74% in another, +124% at a third and +101% at two thirds with a bench beside the
 * suite; quiet, the bench reads −6% to +8%. On a machine short of CPU now and then, the rest of a
 * run goes faster than the pace of the seconds before one reading (counting each request in flight
 * from its time out, not whole, moved the quiet bench 6–12 points low and was not kept). Each
 * figure is therefore the median of the readings over a stretch of turns (ETA_SPAN). The bound
 * below is the one that tells the regression apart; the one above catches a forecast of twice the
 * time left.
 */
const LOADED_ERROR = { below: -0.35, above: 1 } as const;

/** Each point's figure is the median of the readings over a tenth of the turns from it (followEta). */
const ETA_SPAN = 0.1;

const started: { stop(): Promise<unknown> }[] = [];

describe('the ETA of a conversation run', () => {
  afterAll(async () => {
    await Promise.all(started.map((s) => s.stop()));
  });

  for (const fleet of ETA_FLEETS) {
    it(`follows the time left at a third and two thirds of the turns (${fleet.name})`, async () => {
      const [server, ...sims] = await Promise.all([startTestServer(), spawnSimulator(etaSimulator(fleet)), spawnSimulator(etaSimulator(fleet))]);
      started.push({ stop: () => server.cleanup() }, ...sims.map((s: SimProcess) => ({ stop: () => s.stop() })));
      for (const sim of sims) await registerEndpoint(server.url, sim.url, { max_concurrency: fleet.slots });
      const created = await createRun(server.url, etaRun(fleet));
      const readings = await followEta(async (path) => (await call(server.url, path)).body, created.id, { span: ETA_SPAN });
      expect(readings.map((r, i) => r.at >= ETA_POINTS[i])).toEqual([true, true]);
      const shown = (r: EtaReading) =>
        `${(100 * r.error).toFixed(1)}% at ${(100 * r.at).toFixed(0)}% (median of ${r.readings}; the first ${(100 * r.first).toFixed(1)}%)`;
      console.log(`conversation ETA (${fleet.name}): ${readings.map(shown).join(', ')}`);
      for (const r of readings) {
        expect(r.error, JSON.stringify(readings)).toBeGreaterThan(LOADED_ERROR.below);
        expect(r.error, JSON.stringify(readings)).toBeLessThan(LOADED_ERROR.above);
      }
      // based_on_samples counts the answered turns.
      const done = (await call(server.url, `/v1/runs/${created.id}`)).body;
      expect(done.forecast.based_on_samples).toBeGreaterThan(done.request_counts.completed);
    });
  }
});
