import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { seededRandom } from '../src/sim/text.js';
import { spawnServer, tempDir, type ServerProcess } from '../test/support/server.js';
import { json, percentile, scaled, sleep, submitPrompts, until, type Figure } from './support.js';

// One server shared by people and regen (README "Sharing servers"): 16 slots, answers of about
// 0.3 s, people's requests arriving at random (Poisson) at about 30% of its capacity, streamed,
// short, with no priority. Side by side in one sitting: people's wait for a slot and time to
// first token with the server to themselves, beside regen as it runs on a server of its own,
// beside regen sharing it, and beside regen sending a low SGLang priority; regen's throughput
// against the capacity people leave over.

const MODEL = 'bench-share';
const SLOTS = 16;
const TTFT_MS = 50;
const ANSWER_MS = 300;
const TOKENS = 25;
const SIM = {
  model: MODEL,
  'max-running': SLOTS,
  'ttft-ms': TTFT_MS,
  'completion-tokens': TOKENS,
  'tokens-per-second': (TOKENS * 1000) / (ANSWER_MS - TTFT_MS),
  'reasoning-tokens': 0,
  seed: 39,
};
const PEOPLE_SHARE = 0.3;
/** People's requests a second: 30% of what 16 slots answer in 0.3 s each. */
const RATE = (PEOPLE_SHARE * SLOTS * 1000) / ANSWER_MS;
/** The share policies measured: slots kept free for people, nothing new while any of theirs waits. */
const RESERVES = (process.env.BENCH_SHARE_RESERVES ?? '2,3,4').split(',').map(Number);
/** The one the reading intervals are compared at, and beside a priority of −1. */
const SHARE = { reserve_slots: Number(process.env.BENCH_SHARE_RESERVE ?? '2'), max_other_queue: 0 };
/** Shared load-reading intervals compared (the first is REGEN_SHARED_LOAD_INTERVAL_MS's default): what following people's traffic more closely costs. */
const INTERVALS = (process.env.BENCH_SHARE_INTERVALS ?? '100,250,1000').split(',').map(Number);
/** SGLang's default preemption threshold is 10: −11 lets people's requests (default priority 0) push regen's out. */
const BULK_PRIORITY = -11;

interface People {
  /** Each request's wait for a slot (the simulator's `x-sim-queued-ms`) and time to first token, ms. */
  waits: number[];
  ttfts: number[];
  /** Share of the server's slot time their requests held. */
  busy: number;
}

/** People's traffic for `ms`: Poisson arrivals at RATE, each a short streamed chat request with no priority. */
async function people(simUrl: string, ms: number, seed: number): Promise<People> {
  const random = seededRandom(seed);
  const waits: number[] = [];
  const ttfts: number[] = [];
  let slotMs = 0;
  const one = async (i: number): Promise<void> => {
    const t0 = performance.now();
    const res = await fetch(`${simUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, stream: true, max_tokens: 64, messages: [{ role: 'user', content: `a quick question, number ${i}` }] }),
    });
    const reader = res.body!.getReader();
    let first: number | undefined;
    for (;;) {
      const { done } = await reader.read();
      if (done) break;
      first ??= performance.now();
    }
    const wait = Number(res.headers.get('x-sim-queued-ms'));
    waits.push(wait);
    ttfts.push((first ?? performance.now()) - t0);
    slotMs += performance.now() - t0 - wait;
  };
  const started = performance.now();
  const sent: Promise<void>[] = [];
  let at = started;
  for (let i = 0; ; i++) {
    at += (-Math.log(1 - random()) * 1000) / RATE;
    if (at - started > ms) break;
    const wait = at - performance.now();
    if (wait > 0) await sleep(wait);
    sent.push(one(i));
  }
  await Promise.all(sent);
  return { waits, ttfts, busy: slotMs / (SLOTS * (performance.now() - started)) };
}

/** CPU seconds a process has used, from /proc (user + system). */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

interface Regen {
  server: ServerProcess;
  endpointId: string;
  stop(): Promise<void>;
}

async function startRegen(sim: SimProcess, sharedIntervalMs: number, endpoint: object): Promise<Regen> {
  const tmp = tempDir('regen-bench-share-');
  const server = await spawnServer(join(tmp.dir, 'data'), { REGEN_SHARED_LOAD_INTERVAL_MS: String(sharedIntervalMs) });
  const stop = async () => {
    await server.kill('SIGKILL');
    tmp.cleanup();
  };
  try {
    const ep = await json<{ id: string }>(server.url, '/v1/endpoints', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ url: sim.url, ...endpoint }),
    });
    await until('the endpoint ready', async () => ((await json(server.url, `/v1/endpoints/${ep.id}`)).state === 'ready' ? true : undefined), 60_000);
    await submitPrompts(server.url, scaled(12_000, 300), { model: MODEL, params: { max_tokens: 64 }, quality: false });
    return { server, endpointId: ep.id, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

async function patchEndpoint(regen: Regen, patch: object): Promise<void> {
  await json(regen.server.url, `/v1/endpoints/${regen.endpointId}`, {
    method: 'PATCH',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(patch),
  });
}

interface Phase {
  name: string;
  people: People | null;
  /** regen's completions a second over the phase. */
  regen: number;
  /** CPU the regen process and the simulator used, in cores. */
  regenCpu: number;
  simCpu: number;
  load: string;
}

/** Measures `ms` of people's traffic (when `withPeople`) beside whatever regen does now. */
async function phase(name: string, sim: SimProcess, regen: Regen | null, ms: number, withPeople: boolean, seed: number): Promise<Phase> {
  // Answers as the server counts them, at once (the run's counts are committed in batches); people's are taken off.
  const completed = async () => (await sim.stats()).completed;
  const c0 = await completed();
  const cpu0 = { regen: regen ? cpuSeconds(regen.server.proc.pid!) : 0, sim: cpuSeconds(sim.proc.pid!) };
  const t0 = performance.now();
  let seen: People | null = null;
  if (withPeople) seen = await people(sim.url, ms, seed);
  else await sleep(ms);
  const seconds = (performance.now() - t0) / 1000;
  const result: Phase = {
    name,
    people: seen,
    regen: ((await completed()) - c0 - (seen?.waits.length ?? 0)) / seconds,
    regenCpu: regen ? (cpuSeconds(regen.server.proc.pid!) - cpu0.regen) / seconds : 0,
    simCpu: (cpuSeconds(sim.proc.pid!) - cpu0.sim) / seconds,
    load: loadavg()
      .map((l) => l.toFixed(2))
      .join(' '),
  };
  const p = seen
    ? `wait p50 ${percentile(seen.waits, 50).toFixed(0)} p95 ${percentile(seen.waits, 95).toFixed(0)} ms, ttft p50 ${percentile(seen.ttfts, 50).toFixed(0)} p95 ${percentile(seen.ttfts, 95).toFixed(0)} ms, ${seen.waits.length} requests, busy ${(seen.busy * 100).toFixed(1)}%; `
    : '';
  console.error(
    `  ${name}: ${p}regen ${result.regen.toFixed(1)}/s, cpu regen ${result.regenCpu.toFixed(2)} sim ${result.simCpu.toFixed(2)}, load ${result.load}`,
  );
  return result;
}

export async function benchShare(): Promise<Figure[]> {
  const ms = scaled(20_000, 1500);
  const warmMs = scaled(3000, 300);
  const sim = await spawnSimulator(SIM);
  const phases: Phase[] = [];
  try {
    phases.push(await phase('people alone', sim, null, ms, true, 1));
    const regen = await startRegen(sim, INTERVALS[0], {});
    try {
      await sleep(warmMs);
      phases.push(await phase('regen alone', sim, regen, ms / 2, false, 0));
      phases.push(await phase('people beside regen as today', sim, regen, ms, true, 2));
      for (const reserve of RESERVES) {
        await patchEndpoint(regen, { share: { ...SHARE, reserve_slots: reserve } });
        await sleep(warmMs);
        phases.push(await phase(`people beside regen sharing (reserve_slots ${reserve}, ${INTERVALS[0]} ms readings)`, sim, regen, ms, true, 3));
      }
      await sim.configure({ enablePriorityScheduling: 1, defaultPriorityValue: 0 });
      // Within the threshold: people's requests go ahead of regen's in the queue but never push them out.
      await patchEndpoint(regen, { share: SHARE, request_priority: -1 });
      await sleep(warmMs);
      phases.push(
        await phase(`people beside regen sharing (reserve_slots ${SHARE.reserve_slots}) at priority -1 (SGLang priority scheduling)`, sim, regen, ms, true, 5),
      );
      await patchEndpoint(regen, { share: null, request_priority: BULK_PRIORITY });
      await sleep(warmMs);
      phases.push(await phase(`people beside regen at priority ${BULK_PRIORITY} (SGLang priority scheduling, no share)`, sim, regen, ms, true, 4));
      await sim.configure({ enablePriorityScheduling: 0 });
    } finally {
      await regen.stop();
    }
    for (const interval of INTERVALS.slice(1)) {
      const other = await startRegen(sim, interval, { share: SHARE });
      try {
        await sleep(warmMs);
        phases.push(await phase(`people beside regen sharing (reserve_slots ${SHARE.reserve_slots}, ${interval} ms readings)`, sim, other, ms, true, 3));
      } finally {
        await other.stop();
      }
    }
  } finally {
    await sim.stop();
  }
  return figures(phases);
}

function figures(phases: Phase[]): Figure[] {
  const [alone, regenAlone, today, ...rest] = phases;
  const shared = rest.slice(0, RESERVES.length);
  const [ordered, prioritized, ...intervals] = rest.slice(RESERVES.length);
  const p95 = (p: Phase) => percentile(p.people!.waits, 95);
  const aloneP95 = p95(alone);
  const waitGoal = 1.2 * aloneP95 + 50;
  // The capacity people leave over: what regen answers alone, less the share of slot time people hold.
  const leftOver = (p: Phase) => regenAlone.regen * (1 - p.people!.busy);
  const row = (p: Phase): string => {
    const w = p.people!;
    return `wait p50/p95 ${percentile(w.waits, 50).toFixed(0)}/${p95(p).toFixed(0)} ms, TTFT p50/p95 ${percentile(w.ttfts, 50).toFixed(0)}/${percentile(w.ttfts, 95).toFixed(0)} ms, load ${p.load}`;
  };
  const waitFigure = (p: Phase, goal: boolean): Figure => ({
    part: 'share',
    figure: `people's p95 wait for a slot, ${p.name} (${row(p)}) vs alone (${row(alone)})`,
    regen: p95(p),
    baseline: aloneP95,
    unit: 'ms',
    ratio: null,
    target: goal ? `≤ 1.2 × alone + 50 ms (${waitGoal.toFixed(0)} ms)` : 'for comparison',
    ok: goal ? p95(p) <= waitGoal : null,
  });
  const throughputFigure = (p: Phase, goal: boolean): Figure => ({
    part: 'share',
    figure: `regen's throughput, ${p.name} (regen ${p.regenCpu.toFixed(2)} cores, simulator ${p.simCpu.toFixed(2)}) vs the capacity left over (alone ${regenAlone.regen.toFixed(1)}/s × (1 − people's ${(p.people!.busy * 100).toFixed(1)}%))`,
    regen: p.regen,
    baseline: leftOver(p),
    unit: 'samples/s',
    ratio: p.regen / leftOver(p),
    target: goal ? '≥ 0.75 × left over' : 'for comparison',
    ok: goal ? p.regen >= 0.75 * leftOver(p) : null,
  });
  return [
    waitFigure(today, false),
    throughputFigure(today, false),
    ...shared.flatMap((p) => [waitFigure(p, true), throughputFigure(p, true)]),
    waitFigure(ordered, true),
    throughputFigure(ordered, true),
    waitFigure(prioritized, true),
    throughputFigure(prioritized, true),
    ...intervals.flatMap((p) => [waitFigure(p, false), throughputFigure(p, false)]),
  ];
}
