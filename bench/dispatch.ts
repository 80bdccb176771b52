import { join } from 'node:path';
import OpenAI from 'openai';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { spawnServer, tempDir, type ServerProcess } from '../test/support/server.js';
import { json, promptLine, scaled, submitPrompts, until, type Figure } from './support.js';

const MODEL = 'bench-model';

async function registerAndWait(server: ServerProcess, sims: SimProcess[]): Promise<void> {
  for (const sim of sims) {
    await json(server.url, '/v1/endpoints', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ url: sim.url }) });
  }
  await until(
    'endpoints ready',
    async () => {
      const eps = await json<{ data: { state: string }[] }>(server.url, '/v1/endpoints');
      return eps.data.every((e) => e.state === 'ready') ? true : undefined;
    },
    30_000,
  );
}

interface RunTimes {
  status: string;
  started_at: string;
  finished_at: string;
  request_counts: { completed: number };
}

async function waitDone(server: ServerProcess, runId: string, onPoll?: () => Promise<void>): Promise<RunTimes> {
  return until(
    'the run to complete',
    async () => {
      if (onPoll) await onPoll();
      const r = await json<RunTimes>(server.url, `/v1/runs/${runId}`);
      if (['failed', 'cancelled', 'paused'].includes(r.status)) throw new Error(`bench run ended ${r.status}`);
      return r.status === 'completed' ? r : undefined;
    },
    900_000,
    onPoll ? 100 : 50,
  );
}

/** A bare openai-client loop: `concurrency` workers per simulator, no bookkeeping at all. */
async function bareLoop(sims: SimProcess[], perSim: number, n: number): Promise<number> {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    sims.flatMap((sim) => {
      const client = new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: 'none', maxRetries: 0 });
      return Array.from({ length: perSim }, async () => {
        while (next < n) {
          const i = next++;
          const line = JSON.parse(promptLine(i)) as { messages: OpenAI.ChatCompletionMessageParam[] };
          await client.chat.completions.create({ model: MODEL, messages: line.messages, max_tokens: 256 });
        }
      });
    }),
  );
  return n / ((performance.now() - t0) / 1000);
}

const seconds = (r: RunTimes) => (Date.parse(r.finished_at) - Date.parse(r.started_at)) / 1000;

export async function benchDispatch(): Promise<Figure[]> {
  const n = scaled(20_000, 200);
  const perSim = 64;
  const tmp = tempDir('regen-bench-dispatch-');
  const sims = await Promise.all([0, 1].map(() => spawnSimulator({ model: MODEL, 'max-running': perSim, 'max-queue': 100_000 })));
  const server = await spawnServer(join(tmp.dir, 'data'));
  try {
    await registerAndWait(server, sims);
    const before = await bareLoop(sims, perSim, n);
    const runId = await submitPrompts(server.url, n, { model: MODEL, params: { max_tokens: 256 }, quality: false });
    const done = await waitDone(server, runId);
    const regen = done.request_counts.completed / seconds(done);
    const after = await bareLoop(sims, perSim, n);
    const baseline = (before + after) / 2;
    return [
      {
        part: 'dispatch',
        figure: `samples/s, ${n.toLocaleString('en')} samples, 2 zero-latency simulators × ${perSim} slots`,
        regen,
        baseline,
        unit: 'samples/s',
        ratio: regen / baseline,
        target: '≥ 0.9 × bare openai loop',
        ok: regen / baseline >= 0.9,
      },
    ];
  } finally {
    await server.kill('SIGTERM');
    await Promise.all(sims.map((s) => s.stop()));
    tmp.cleanup();
  }
}

export async function benchSaturation(): Promise<Figure[]> {
  const simCount = 4;
  const slots = 64;
  const latencyMs = 1000;
  const waves = scaled(20, 3);
  const n = simCount * slots * waves;
  const tmp = tempDir('regen-bench-saturation-');
  const sims = await Promise.all(
    Array.from({ length: simCount }, () => spawnSimulator({ model: MODEL, 'max-running': slots, 'ttft-ms': latencyMs, 'max-queue': 100_000 })),
  );
  const server = await spawnServer(join(tmp.dir, 'data'));
  try {
    await registerAndWait(server, sims);
    const runId = await submitPrompts(server.url, n, { model: MODEL, params: { max_tokens: 256 }, quality: false });
    const samples: { at: number; running: number; pending: number }[] = [];
    const done = await waitDone(server, runId, async () => {
      const [stats, run] = await Promise.all([
        Promise.all(sims.map((s) => s.stats())),
        json<{ request_counts: { pending: number } }>(server.url, `/v1/runs/${runId}`),
      ]);
      samples.push({ at: Date.now(), running: stats.reduce((a, s) => a + s.running, 0), pending: run.request_counts.pending });
    });
    const start = Date.parse(done.started_at);
    const end = Date.parse(done.finished_at);
    const busyOf = (window: typeof samples) => (window.length ? window.reduce((a, s) => a + s.running, 0) / window.length / (simCount * slots) : 0);
    // Steady state: leave out the first and the last wave (ramp-up and drain).
    const busy = busyOf(samples.filter((s) => s.at > start + latencyMs && s.at < end - latencyMs));
    // While samples are still waiting to be claimed, every slot has one to take: the drain after
    // the last is claimed (up to a wave and the servers' queues) is the run's end, not a gap.
    const whileWork = busyOf(samples.filter((s) => s.at > start + latencyMs && s.pending > 0));
    const wall = seconds(done);
    const ideal = (n * latencyMs) / 1000 / (simCount * slots);
    return [
      {
        part: 'saturation',
        figure: `share of slot-time busy, ${simCount} simulators × ${slots} slots, ${latencyMs} ms per request`,
        regen: busy * 100,
        baseline: 100,
        unit: '%',
        ratio: busy,
        target: '≥ 99.5%',
        ok: busy >= 0.995,
      },
      {
        part: 'saturation',
        figure: `share of slot-time busy while samples wait to be claimed, ${simCount} simulators × ${slots} slots, ${latencyMs} ms per request`,
        regen: whileWork * 100,
        baseline: 100,
        unit: '%',
        ratio: whileWork,
        target: '≥ 99.5%',
        ok: whileWork >= 0.995,
      },
      {
        part: 'saturation',
        figure: `wall time of ${n.toLocaleString('en')} samples vs samples × latency ÷ slots`,
        regen: wall,
        baseline: ideal,
        unit: 's',
        ratio: ideal / wall,
        target: 'within 3% (wall ≤ 1.03 × ideal)',
        ok: wall <= ideal * 1.03,
      },
    ];
  } finally {
    await server.kill('SIGTERM');
    await Promise.all(sims.map((s) => s.stop()));
    tmp.cleanup();
  }
}

/**
 * Streamed against buffered answers, side by side on the same simulators: the same run twice,
 * quality checks on in both, stop_loops on in one (every answer streamed, one SSE event a token)
 * and off in the other. The buffered run goes first and last, its mean the baseline, so drift in
 * the machine's load falls on both sides.
 */
export async function benchStream(): Promise<Figure[]> {
  const n = scaled(10_000, 200);
  const perSim = 64;
  // The simulator's default answer: 32 reasoning tokens and 64 of content, each its own event when streamed.
  const tokens = 96;
  const tmp = tempDir('regen-bench-stream-');
  const sims = await Promise.all([0, 1].map(() => spawnSimulator({ model: MODEL, 'max-running': perSim, 'max-queue': 100_000 })));
  const server = await spawnServer(join(tmp.dir, 'data'));
  const rate = async (stopLoops: boolean) => {
    const runId = await submitPrompts(server.url, n, {
      model: MODEL,
      params: { max_tokens: 256 },
      quality: { gate: false, retry_flagged: 0, stop_loops: stopLoops },
    });
    const done = await waitDone(server, runId);
    return done.request_counts.completed / seconds(done);
  };
  try {
    await registerAndWait(server, sims);
    const before = await rate(false);
    const streamed = await rate(true);
    const after = await rate(false);
    const buffered = (before + after) / 2;
    return [
      {
        part: 'stream',
        figure: `samples/s streamed (stop_loops) against buffered, ${n.toLocaleString('en')} samples of ${tokens} tokens, 2 zero-latency simulators × ${perSim} slots`,
        regen: streamed,
        baseline: buffered,
        unit: 'samples/s',
        ratio: streamed / buffered,
        target: `reported: ${Math.round(streamed * tokens).toLocaleString('en')} streamed tokens/s`,
        ok: null,
      },
    ];
  } finally {
    await server.kill('SIGTERM');
    await Promise.all(sims.map((s) => s.stop()));
    tmp.cleanup();
  }
}
