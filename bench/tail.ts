import { join } from 'node:path';
import { mulberry32 } from '../src/domain/forecast.js';
import { spawnSimulator } from '../src/sim/spawn.js';
import { spawnServer, tempDir } from '../test/support/server.js';
import { json, scaled, until, type Figure } from './support.js';

// Heavy-tailed answer lengths (log-normal: median 60 tokens, a few of several thousand), each line
// carrying an old assistant turn whose length predicts the new answer's within ±30%, as a
// regeneration's input does. Ordered four ways, each run in input order and length-aware, on one
// endpoint of CAP slots at TOKENS_PER_SECOND a request: the tail is wall time − the ideal wall time
// of a fleet kept full to the end (completion tokens / (CAP × TOKENS_PER_SECOND)).
const MODEL = 'bench-tail';
const CAP = 32;
const TOKENS_PER_SECOND = 2000;
const MEDIAN_TOKENS = 60;
const SIGMA = 1.3;
const MAX_TOKENS = 6000;
const PREDICTION_NOISE = 0.3;
const ORDERINGS = ['input', 'random', 'short_first', 'long_first'] as const;
type Ordering = (typeof ORDERINGS)[number];

/** A seeded generator (mulberry32), so each bench run measures the same input. */
const random = mulberry32;

function lengths(n: number): number[] {
  const r = random(42);
  return Array.from({ length: n }, () => {
    // Box-Muller: a standard normal from two uniforms.
    const z = Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
    return Math.min(MAX_TOKENS, Math.max(8, Math.round(MEDIAN_TOKENS * Math.exp(SIGMA * z))));
  });
}

function ordered(lens: number[], ordering: Ordering): number[] {
  if (ordering === 'short_first') return [...lens].sort((a, b) => a - b);
  if (ordering === 'long_first') return [...lens].sort((a, b) => b - a);
  if (ordering === 'random') {
    const r = random(7);
    const out = [...lens];
    for (let i = out.length - 1; i > 0; i--) {
      const j = Math.floor(r() * (i + 1));
      [out[i], out[j]] = [out[j], out[i]];
    }
    return out;
  }
  return lens;
}

function jsonl(lens: number[]): string {
  const r = random(3);
  return (
    lens
      .map((len, i) => {
        const old = Math.round(len * (1 + PREDICTION_NOISE * (2 * r() - 1)));
        return JSON.stringify({
          custom_id: `t${i}`,
          messages: [
            { role: 'user', content: `question ${i} [len=${len}]` },
            // Four characters a token, as the simulator and regen's prediction count them.
            { role: 'assistant', content: 'x'.repeat(old * 4) },
          ],
        });
      })
      .join('\n') + '\n'
  );
}

interface Measured {
  wall: number;
  ideal: number;
  forecastAt10: number | null;
  oldEtaAt10: number | null;
}

async function measure(base: string, fileId: string, order: 'input' | 'length_aware', total: number): Promise<Measured> {
  const created = await json<{ id: string }>(base, '/v1/runs', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, input: { file_id: fileId }, regenerate: 'last_assistant', dispatch_order: order, shard_size: 250, quality: false }),
  });
  let forecastAt10: number | null = null;
  let oldEtaAt10: number | null = null;
  const done = await until(
    'the run to finish',
    async () => {
      const r = await json(base, `/v1/runs/${created.id}`);
      if (forecastAt10 === null && r.progress.fraction >= 0.1 && r.forecast?.wall_seconds_estimate != null) {
        forecastAt10 = r.forecast.wall_seconds_estimate;
        const left = r.request_counts.pending + r.request_counts.in_progress;
        const elapsed = (Date.now() - Date.parse(r.started_at)) / 1000;
        // The ETA regen gave before the forecast: samples left at the last minute's samples a second.
        oldEtaAt10 = r.progress.samples_per_second > 0 ? elapsed + left / r.progress.samples_per_second : null;
      }
      return r.status === 'completed' ? r : undefined;
    },
    10 * 60_000,
    50,
  );
  if (done.request_counts.completed !== total) throw new Error(`run ${created.id}: ${done.request_counts.completed} of ${total} completed`);
  const wall = (Date.parse(done.finished_at) - Date.parse(done.started_at)) / 1000;
  return { wall, ideal: done.usage.completion_tokens / (CAP * TOKENS_PER_SECOND), forecastAt10, oldEtaAt10 };
}

const errorPct = (estimate: number | null, wall: number) => (estimate === null ? Number.NaN : (100 * Math.abs(estimate - wall)) / wall);

/** The tail in input order against length-aware order, and the forecast's error at 10% done, per ordering of the input. */
export async function benchTail(): Promise<Figure[]> {
  const n = scaled(6000, 200);
  const lens = lengths(n);
  const tmp = tempDir('regen-bench-tail-');
  const sim = await spawnSimulator({ model: MODEL, 'max-running': CAP, 'tokens-per-second': TOKENS_PER_SECOND, 'reasoning-tokens': 0 });
  const server = await spawnServer(join(tmp.dir, 'data'));
  const figures: Figure[] = [];
  try {
    await json(server.url, '/v1/endpoints', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ url: sim.url, max_concurrency: CAP }),
    });
    for (const ordering of ORDERINGS) {
      const file = await json<{ id: string }>(server.url, `/v1/files?filename=${ordering}.jsonl`, {
        method: 'POST',
        headers: { 'content-type': 'application/jsonl' },
        body: jsonl(ordered(lens, ordering)),
      });
      const inOrder = await measure(server.url, file.id, 'input', n);
      const aware = await measure(server.url, file.id, 'length_aware', n);
      const tailIn = inOrder.wall - inOrder.ideal;
      const tailAware = aware.wall - aware.ideal;
      figures.push({
        part: 'tail',
        figure: `tail (wall − ideal ${inOrder.ideal.toFixed(1)} s), ${ordering.replace('_', ' ')}: length-aware vs input order`,
        regen: tailAware,
        baseline: tailIn,
        unit: 's',
        ratio: tailAware > 0 ? tailIn / tailAware : null,
        target: 'lower',
        ok: tailAware <= tailIn,
      });
      const forecastErr = errorPct(inOrder.forecastAt10, inOrder.wall);
      figures.push({
        part: 'tail',
        figure: `forecast error at 10% done, ${ordering.replace('_', ' ')} (baseline: samples/s ETA)`,
        regen: forecastErr,
        baseline: errorPct(inOrder.oldEtaAt10, inOrder.wall),
        unit: '%',
        ratio: null,
        target: '< 25%',
        ok: forecastErr < 25,
      });
    }
  } finally {
    await server.kill('SIGKILL');
    await sim.stop();
    tmp.cleanup();
  }
  return figures;
}
