import { spawnSimulator } from '../src/sim/spawn.js';
import { ETA_FLEETS, ETA_POINTS, ETA_TOLERANCE, type EtaFleet, etaRun, etaSimulator, followEta } from '../test/support/conversation-eta.js';
import { spawnServer, tempDir } from '../test/support/server.js';
import { json, type Figure } from './support.js';

// The ETA of a conversation run (uneven conversations of 1–6 turns, answers of 20–180 tokens) on
// two slow simulators, on a fleet the conversations queue for and on one where their chains set
// the time: its error against the time the run really took, at a third and at two thirds of its
// turns (test/support/conversation-eta.ts). Goal: within ±15% at both.

export async function benchConversationEta(): Promise<Figure[]> {
  const figures: Figure[] = [];
  for (const fleet of ETA_FLEETS) figures.push(...(await oneFleet(fleet)));
  return figures;
}

async function oneFleet(fleet: EtaFleet): Promise<Figure[]> {
  const tmp = tempDir('regen-bench-eta-');
  const sims = await Promise.all([spawnSimulator(etaSimulator(fleet)), spawnSimulator(etaSimulator(fleet))]);
  const server = await spawnServer(tmp.dir);
  try {
    for (const sim of sims) {
      await json(server.url, '/v1/endpoints', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ url: sim.url, max_concurrency: fleet.slots }),
      });
    }
    const run = await json<{ id: string }>(server.url, '/v1/runs', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(etaRun(fleet)),
    });
    const readings = await followEta((path) => json(server.url, path), run.id);
    return readings.map((r, i) => {
      console.error(
        `${fleet.name}: conversation ETA at ${(100 * ETA_POINTS[i]).toFixed(0)}% of turns: said ${r.eta} s, took ${r.actual.toFixed(1)} s (${(100 * r.error).toFixed(1)}%)`,
      );
      return {
        part: 'conversations',
        figure: `ETA error at ${i === 0 ? 'a third' : 'two thirds'} of the turns (${fleet.conversations} conversations of 1–6 turns on ${2 * fleet.slots} slots; said ${r.eta} s, took ${r.actual.toFixed(1)} s)`,
        regen: 100 * r.error,
        baseline: null,
        unit: '%',
        ratio: null,
        target: '±15%',
        ok: Math.abs(r.error) <= ETA_TOLERANCE,
      };
    });
  } finally {
    await server.kill('SIGTERM');
    await Promise.all(sims.map((s) => s.stop()));
    tmp.cleanup();
  }
}
