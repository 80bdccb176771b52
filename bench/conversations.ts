import { readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gunzipSync } from 'node:zlib';
import { mulberry32 } from '../src/domain/forecast.js';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { promptSequence } from '../src/sim/text.js';
import { spawnServer, tempDir } from '../test/support/server.js';
import { benchAgentic } from './agentic.js';
import { benchConversationEta } from './conversation-eta.js';
import { cacheAwareRouter, json, percentile, scaled, sleep, until, type Figure } from './support.js';

// Multi-turn regeneration on 4 simulated servers with prefix caches (SGLang's radix cache, in the
// KV pool), four ways side by side, thinking on and off:
//  - regen with affinity (each turn to the endpoint that answered the conversation's last turn),
//  - regen without it (the least-loaded choice),
//  - a plain round robin that walks each conversation turn by turn,
//  - a reference modelled on SGLang's model gateway `cache_aware` policy: a prefix tree per worker
//    of the prompts sent there, the best match when it covers over half the prompt, else the
//    least loaded worker.
// regen runs each way as one run with `regenerate: "all_assistant"` (turn by turn, each turn durable);
// the way without affinity is a regen started with REGEN_AFFINITY=off.
// Simulated prefill and decode dwarf regen's own work (a turn takes 1–3 s, as a short answer does on a
// real server), so the figures measure dispatch, not the 2-core machine: at a quarter of these
// times regen's own work per request, on the cores the simulators share, cost it 14% of the
// reference's speed without thinking.
// For a focused rerun: BENCH_CONV_THINKING=true|false runs one of the two, BENCH_CONV_MODES a
// comma-separated list of words of the ways' names (`affinity,reference`), BENCH_CONV_ORDER gives
// regen's runs a dispatch_order, BENCH_CONV_TIMELINE a file for regen's slots in use over time,
// BENCH_CONV_WORKLOADS a comma-separated list of the workloads to run (`eta,plain,agentic`, all by
// default; bench/agentic.ts has the agentic one).
const MODEL = 'bench-conv';
const SERVERS = 4;
const SLOTS = 32;
// Each server's KV pool: room for the prefixes of every conversation, as when regen walked them in
// waves (a run per turn): the ways compare dispatch, not eviction.
const KV_TOKENS = 1_000_000;
// Decode steps a second (each gives every running request one token) and prefill tokens a second, per server.
const STEPS_PER_SECOND = 100;
const PREFILL_PER_SECOND = 15_000;
const REASONING_TOKENS = 48;
const MAX_TURNS = 8;
/** How often the bench samples regen's slots in use. */
const POLL_MS = 100;

interface Conversation {
  id: string;
  system: string;
  users: string[];
}

/** A seeded generator (mulberry32), so each bench run measures the same input. */
const random = mulberry32;

const WORDS = ['data', 'model', 'cache', 'prefix', 'server', 'token', 'answer', 'question', 'turn', 'graph', 'value', 'table'];
const words = (r: () => number, tokens: number) => {
  let s = '';
  while (s.length < tokens * 4) s += `${WORDS[Math.floor(r() * WORDS.length)]} `;
  return s.slice(0, tokens * 4);
};

function conversations(n: number): Conversation[] {
  const r = random(24);
  return Array.from({ length: n }, (_, i) => {
    const turns = 1 + Math.floor(r() * MAX_TURNS);
    return {
      id: `c${i}`,
      system: `You are assistant ${i}. ${words(r, 60 + Math.floor(r() * 200))}`,
      users: Array.from({ length: turns }, (_, k) => `Turn ${k} of ${i}: ${words(r, 40 + Math.floor(r() * 160))} [len=${40 + Math.floor(r() * 120)}]`),
    };
  });
}

type Message = { role: string; content: string };
const history = (c: Conversation, answers: string[], turn: number): Message[] => {
  const messages: Message[] = [{ role: 'system', content: c.system }];
  for (let k = 0; k <= turn; k++) {
    messages.push({ role: 'user', content: c.users[k] });
    if (k < turn) messages.push({ role: 'assistant', content: answers[k] });
  }
  return messages;
};

interface Tally {
  wall: number;
  prompt: number;
  cached: number;
  ideal: number;
  /** Each request's latency, for the tail. */
  latencies: number[];
  /** Sum of request latencies over the wall time of all slots. */
  busy: number;
  /**
   * The same over the dispatch window only, from the first request sent to the last answer: what
   * the dispatcher keeps busy, without regen's upload and validation before it or the output
   * written after it (the bench's walkers have neither).
   */
  busyDispatching: number;
}

/** What the servers could at best serve from cache: each turn's previous prompt (thinking), and its answer too (no thinking). */
function idealCached(prompts: number[][], answers: number[][], thinking: boolean): number {
  let ideal = 0;
  for (const [c, turns] of prompts.entries()) {
    for (let k = 1; k < turns.length; k++) ideal += Math.min(turns[k] - 1, turns[k - 1] + (thinking ? 0 : answers[c][k - 1]));
  }
  return ideal;
}

async function statsOf(sims: SimProcess[]): Promise<{ prompt: number; cached: number }> {
  const all = await Promise.all(sims.map((s) => s.stats()));
  return { prompt: all.reduce((a, s) => a + s.promptTokens, 0), cached: all.reduce((a, s) => a + s.cachedTokens, 0) };
}

/** A dispatcher of the bench's own: walks every conversation turn by turn, `route` picking each turn's server. */
async function walk(
  sims: SimProcess[],
  convs: Conversation[],
  thinking: boolean,
  route: (messages: Message[], load: number[]) => number,
  sent: (server: number, messages: Message[]) => void,
): Promise<Omit<Tally, 'ideal'> & { prompts: number[][]; answers: number[][] }> {
  const load = sims.map(() => 0);
  const latencies: number[] = [];
  const prompts: number[][] = convs.map(() => []);
  const answerTokens: number[][] = convs.map(() => []);
  const before = await statsOf(sims);
  const started = performance.now();
  let next = 0;
  let busy = 0;
  let lastAnswer = started;
  const worker = async (): Promise<void> => {
    while (next < convs.length) {
      const i = next++;
      const c = convs[i];
      const answers: string[] = [];
      for (let k = 0; k < c.users.length; k++) {
        const messages = history(c, answers, k);
        const server = route(messages, load);
        load[server]++;
        const t0 = performance.now();
        const res = await fetch(`${sims[server].url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: MODEL, messages, chat_template_kwargs: { enable_thinking: thinking } }),
        });
        const body = (await res.json()) as { choices: { message: { content: string } }[]; usage: { prompt_tokens: number; completion_tokens: number } };
        const ms = performance.now() - t0;
        lastAnswer = Math.max(lastAnswer, performance.now());
        load[server]--;
        latencies.push(ms);
        busy += ms;
        sent(server, [...messages, { role: 'assistant', content: body.choices[0].message.content }]);
        answers.push(body.choices[0].message.content);
        prompts[i].push(body.usage.prompt_tokens);
        answerTokens[i].push(thinking ? 0 : body.usage.completion_tokens + 1);
      }
    }
  };
  await Promise.all(Array.from({ length: SERVERS * SLOTS }, worker));
  const wall = (performance.now() - started) / 1000;
  const after = await statsOf(sims);
  return {
    wall,
    prompt: after.prompt - before.prompt,
    cached: after.cached - before.cached,
    latencies,
    busy: busy / 1000 / (wall * SERVERS * SLOTS),
    busyDispatching: busy / (lastAnswer - started) / (SERVERS * SLOTS),
    prompts,
    answers: answerTokens,
  };
}

function roundRobin(): (messages: Message[], load: number[]) => number {
  let i = 0;
  return (_m, load) => i++ % load.length;
}

/** Lines of every output shard a run wrote (its output_uri is a local folder here). */
function outputLines(outputUri: string): Record<string, any>[] {
  const root = fileURLToPath(outputUri);
  const lines: Record<string, any>[] = [];
  const visit = (dir: string): void => {
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      if (statSync(path).isDirectory()) visit(path);
      else if (/\.jsonl(\.gz)?$/.test(name)) {
        const raw = readFileSync(path);
        const text = name.endsWith('.gz') ? gunzipSync(raw).toString() : raw.toString();
        for (const line of text.split('\n')) if (line.trim()) lines.push(JSON.parse(line));
      }
    }
  };
  visit(root);
  return lines;
}

/**
 * regen on one run with `regenerate: "all_assistant"`: each conversation walked turn by turn, its
 * input's old replies dropped. With affinity (REGEN_AFFINITY=on, the default) each turn goes to the
 * endpoint that answered the one before; without it, wherever a slot is free first.
 */
async function regenRun(
  base: string,
  sims: SimProcess[],
  convs: Conversation[],
  thinking: boolean,
): Promise<Omit<Tally, 'ideal'> & { prompts: number[][]; answers: number[][] }> {
  const body =
    convs
      .map((c) => {
        const messages: Message[] = [{ role: 'system', content: c.system }];
        for (const [k, user] of c.users.entries()) messages.push({ role: 'user', content: user }, { role: 'assistant', content: `an old reply ${k}` });
        return JSON.stringify({ id: c.id, messages });
      })
      .join('\n') + '\n';
  const before = await statsOf(sims);
  const started = performance.now();
  const file = await json<{ id: string }>(base, '/v1/files?filename=conversations.jsonl', {
    method: 'POST',
    headers: { 'content-type': 'application/jsonl' },
    body,
  });
  const run = await json<{ id: string }>(base, '/v1/runs', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: MODEL,
      input: { file_id: file.id },
      regenerate: 'all_assistant',
      ...(process.env.BENCH_CONV_ORDER && { dispatch_order: process.env.BENCH_CONV_ORDER }),
      quality: false,
      params: { chat_template_kwargs: { enable_thinking: thinking } },
    }),
  });
  // Slots in use over the run, sampled: when the fleet first filled, and when it last was full.
  const timeline: { t: number; inFlight: number }[] = [];
  const done = await until(
    'the run to finish',
    async () => {
      const [r, endpoints] = await Promise.all([json(base, `/v1/runs/${run.id}`), json(base, '/v1/endpoints')]);
      if (r.status === 'failed' || r.status === 'cancelled') throw new Error(`run ${run.id} ${r.status}: ${r.status_reason}`);
      const inFlight = endpoints.data.reduce((a: number, e: any) => a + (e.in_flight ?? 0), 0);
      timeline.push({ t: (performance.now() - started) / 1000, inFlight });
      return r.status === 'completed' ? r : undefined;
    },
    60 * 60_000,
    POLL_MS,
  );
  const wall = (performance.now() - started) / 1000;
  // The dispatch window, to the sampling's resolution: from the first sample with a request in flight to the last.
  const sending = timeline.filter((p) => p.inFlight > 0);
  const dispatching = sending.length ? sending.at(-1)!.t - sending[0].t + POLL_MS / 1000 : wall;
  const full = timeline.filter((p) => p.inFlight >= SERVERS * SLOTS);
  const inFlight = (ps: typeof timeline) => (100 * ps.reduce((a, p) => a + p.inFlight, 0)) / Math.max(1, ps.length) / (SERVERS * SLOTS);
  const [firstFull, lastFull] = [full[0]?.t ?? wall, full.at(-1)?.t ?? wall];
  console.error(
    `  regen: first request at ${(sending[0]?.t ?? 0).toFixed(1)} s, ` +
      (full.length
        ? `every slot busy from ${firstFull.toFixed(1)} s to ${lastFull.toFixed(1)} s (${inFlight(timeline.filter((p) => p.t >= firstFull && p.t <= lastFull)).toFixed(1)}% in flight between), `
        : 'never every slot busy at once, ') +
      `last answer at ${(sending.at(-1)?.t ?? wall).toFixed(1)} s, completed at ${wall.toFixed(1)} s`,
  );
  if (process.env.BENCH_CONV_TIMELINE) writeFileSync(process.env.BENCH_CONV_TIMELINE, JSON.stringify(timeline));
  const after = await statsOf(sims);
  const prompts: number[][] = convs.map(() => []);
  const answerTokens: number[][] = convs.map(() => []);
  const latencies: number[] = [];
  let busy = 0;
  for (const line of outputLines(done.output_uri)) {
    const i = Number(String(line.custom_id).slice(1));
    for (const t of line.turns) {
      prompts[i].push(t.usage.prompt_tokens);
      answerTokens[i].push(thinking ? 0 : t.usage.completion_tokens + 1);
      latencies.push(t.latency_ms);
      busy += t.latency_ms;
    }
  }
  return {
    wall,
    prompt: after.prompt - before.prompt,
    cached: after.cached - before.cached,
    latencies,
    busy: busy / 1000 / (wall * SERVERS * SLOTS),
    busyDispatching: busy / 1000 / (dispatching * SERVERS * SLOTS),
    prompts,
    answers: answerTokens,
  };
}

/** Single prompts that share a long system prompt (a few-shot block): how much does spreading them over the servers cost the cache? */
async function sharedPrefix(base: string, sims: SimProcess[], n: number): Promise<{ cached: number; ideal: number }> {
  const r = random(5);
  const shared = `Examples: ${words(r, 1500)}`;
  const body =
    Array.from({ length: n }, (_, i) =>
      JSON.stringify({
        custom_id: `f${i}`,
        messages: [
          { role: 'system', content: shared },
          { role: 'user', content: `Question ${i}: ${words(r, 60)} [len=60]` },
        ],
      }),
    ).join('\n') + '\n';
  const before = await statsOf(sims);
  const file = await json<{ id: string }>(base, '/v1/files?filename=fewshot.jsonl', { method: 'POST', headers: { 'content-type': 'application/jsonl' }, body });
  const run = await json<{ id: string }>(base, '/v1/runs', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, input: { file_id: file.id }, quality: false, params: { chat_template_kwargs: { enable_thinking: false } } }),
  });
  await until('the few-shot run', async () => ((await json(base, `/v1/runs/${run.id}`)).status === 'completed' ? true : undefined), 10 * 60_000);
  const after = await statsOf(sims);
  // At best every prompt but the very first finds the shared block cached: (n − 1) × its tokens.
  const sharedTokens = promptSequence([{ role: 'system', content: shared }]).length - 3;
  return { cached: after.cached - before.cached, ideal: (n - 1) * sharedTokens };
}

export async function benchConversations(): Promise<Figure[]> {
  const workloads = process.env.BENCH_CONV_WORKLOADS?.split(',') ?? ['eta', 'plain', 'agentic'];
  // The ETA's error first: a minute on two slow servers of their own.
  const eta = workloads.includes('eta') ? await benchConversationEta() : [];
  const n = scaled(2000, 40);
  const convs = conversations(n);
  const tmp = tempDir('regen-bench-conv-');
  const figures: Figure[] = [];
  const startSims = () =>
    Promise.all(
      Array.from({ length: SERVERS }, (_, i) =>
        spawnSimulator({
          model: MODEL,
          seed: i + 1,
          'max-running': SLOTS,
          'kv-tokens': KV_TOKENS,
          'tokens-per-second': STEPS_PER_SECOND,
          'prefill-tokens-per-second': PREFILL_PER_SECOND,
          'reasoning-tokens': REASONING_TOKENS,
          'enable-cache-report': 1,
          // Longer than any pause between a dispatcher's requests: a closed keep-alive socket is not what is measured.
          'keep-alive-ms': 600_000,
        }),
      ),
    );
  // One regen per way, side by side: with affinity (the default) and without it.
  const servers = {
    'regen, affinity': await spawnServer(join(tmp.dir, 'affinity'), { REGEN_ADAPTIVE_CONCURRENCY: 'false' }),
    'regen, least loaded': await spawnServer(join(tmp.dir, 'least-loaded'), { REGEN_ADAPTIVE_CONCURRENCY: 'false', REGEN_AFFINITY: 'off' }),
  };
  try {
    const onlyThinking = process.env.BENCH_CONV_THINKING;
    const plain = workloads.includes('plain');
    for (const thinking of [true, false].filter((t) => plain && (onlyThinking === undefined || String(t) === onlyThinking))) {
      const results: Record<string, Tally> = {};
      const allModes = ['regen, affinity', 'regen, least loaded', 'round robin', 'cache-aware reference'] as const;
      const only = process.env.BENCH_CONV_MODES?.split(',');
      const modes = allModes.filter((m) => !only || only.some((o) => m.includes(o)));
      for (const mode of modes) {
        // Fresh servers for each way: every one starts from empty caches.
        const sims = await startSims();
        // The bench's own dispatchers need no regen: the endpoints are registered on the affinity one, idle.
        const server = mode === 'regen, least loaded' ? servers[mode] : servers['regen, affinity'];
        const ids: string[] = [];
        try {
          for (const sim of sims) {
            const e = await json<{ id: string }>(server.url, '/v1/endpoints', {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ url: sim.url, max_concurrency: SLOTS }),
            });
            ids.push(e.id);
          }
          await until(
            'endpoints ready',
            async () => ((await json(server.url, '/v1/endpoints')).data.every((e: any) => e.state === 'ready') ? true : undefined),
            60_000,
          );
          let got: Omit<Tally, 'ideal'> & { prompts: number[][]; answers: number[][] };
          if (mode === 'round robin') got = await walk(sims, convs, thinking, roundRobin(), () => {});
          else if (mode === 'cache-aware reference') {
            const policy = cacheAwareRouter(SERVERS, KV_TOKENS);
            got = await walk(sims, convs, thinking, policy.route, policy.sent);
          } else got = await regenRun(server.url, sims, convs, thinking);
          results[mode] = { ...got, ideal: idealCached(got.prompts, got.answers, thinking) };
          const t = results[mode];
          console.error(
            `${thinking ? 'thinking' : 'no thinking'}, ${mode}: wall ${t.wall.toFixed(1)} s, prompt ${t.prompt}, cached ${t.cached}, ideal ${t.ideal}, ` +
              `share ${((100 * t.cached) / Math.max(1, t.ideal)).toFixed(1)}%, busy ${(100 * t.busy).toFixed(1)}% of the wall, ${(100 * t.busyDispatching).toFixed(1)}% while dispatching, p50 ${Math.round(percentile(t.latencies, 50))} ms, p99 ${Math.round(percentile(t.latencies, 99))} ms`,
          );
          if (thinking && mode === 'regen, least loaded') {
            const few = await sharedPrefix(server.url, sims, scaled(1000, 40));
            figures.push({
              part: 'conversations',
              figure: 'single prompts sharing a 1,500-token block, least loaded over 4 servers: cached share of the ideal',
              regen: (100 * few.cached) / few.ideal,
              baseline: null,
              unit: '%',
              ratio: null,
              target: '≥ 95% (no affinity needed)',
              ok: few.cached / few.ideal >= 0.95,
            });
          }
        } finally {
          for (const id of ids) await fetch(`${server.url}/v1/endpoints/${id}`, { method: 'DELETE' });
          await Promise.all(sims.map((s) => s.stop()));
          await sleep(200);
        }
      }
      const ref = results['cache-aware reference'];
      const label = thinking ? 'thinking' : 'no thinking';
      for (const mode of modes) {
        const t = results[mode];
        const share = (100 * t.cached) / Math.max(1, t.ideal);
        figures.push({
          part: 'conversations',
          figure: `${label}, ${mode}: cached share of the ideal (prompt tokens computed ${Math.round((t.prompt - t.cached) / 1000)}k)`,
          regen: share,
          baseline: (100 * ref.cached) / Math.max(1, ref.ideal),
          unit: '%',
          ratio: null,
          target: mode === 'regen, affinity' ? '≥ 95%' : '',
          ok: mode === 'regen, affinity' ? share >= 95 : null,
        });
        figures.push({
          part: 'conversations',
          figure: `${label}, ${mode}: wall time vs the reference (p99 request ${Math.round(percentile(t.latencies, 99))} ms)`,
          regen: t.wall,
          baseline: ref.wall,
          unit: 's',
          ratio: ref.wall / t.wall,
          target: mode === 'regen, affinity' ? '≥ 0.95' : '',
          ok: mode === 'regen, affinity' ? ref.wall / t.wall >= 0.95 : null,
        });
        figures.push({
          part: 'conversations',
          figure: `${label}, ${mode}: slot-time busy from the first request to the last answer (of the whole wall: ${(100 * t.busy).toFixed(1)}%)`,
          regen: 100 * t.busyDispatching,
          baseline: 100 * ref.busyDispatching,
          unit: '%',
          ratio: null,
          target: mode === 'regen, affinity' ? '≥ 97%' : '',
          ok: mode === 'regen, affinity' ? t.busyDispatching >= 0.97 : null,
        });
      }
    }
    if (workloads.includes('agentic'))
      figures.push(...(await benchAgentic(servers['regen, affinity'].url, startSims, { slots: SLOTS, kvTokens: KV_TOKENS }, outputLines)));
  } finally {
    for (const server of Object.values(servers)) await server.kill('SIGKILL');
    tmp.cleanup();
  }
  return [...eta, ...figures];
}
