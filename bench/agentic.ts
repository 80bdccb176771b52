import { mulberry32 } from '../src/domain/forecast.js';
import type { SimProcess } from '../src/sim/spawn.js';
import { cacheAwareRouter, json, percentile, scaled, sleep, until, type Figure } from './support.js';

// Agentic conversations on the conversations bench's servers: each user turn may take tool-call
// steps (the simulator calls the tools its "[tools=…]" marker names, one step after another), each
// step a request whose prompt holds the step before it, its call message and the tool results.
// Two ways side by side: regen (`regenerate: "all_assistant"`, the source's results paired with
// the target's calls, affinity on) and the cache-aware reference (SGLang's model gateway policy,
// as in bench/conversations.ts) walking the same tool loops itself. Thinking is off: with it, a new
// user turn drops the loop's reasoning from the template, and each request's earlier prompt is no
// longer its prefix, so the ideal below would not hold.
const MODEL = 'bench-conv';
const MAX_TURNS = 4;
/** How often the bench samples regen's slots in use. */
const POLL_MS = 100;
const PLAIN = { chat_template_kwargs: { enable_thinking: false } };
const TOOL_NAMES = ['search', 'calc', 'fetch', 'lookup'];
const TOOLS = TOOL_NAMES.map((name) => ({
  type: 'function',
  function: { name, description: `the ${name} tool`, parameters: { type: 'object', properties: {} } },
}));

type Message = { role: string; content: string | null; [k: string]: unknown };
type Call = { id: string; type: 'function'; function: { name: string; arguments: string } };

interface Conversation {
  id: string;
  system: string;
  /** Per user turn: its text (with its "[tools=…]" marker) and the functions each step calls. */
  turns: { user: string; steps: string[][] }[];
}

const WORDS = ['data', 'model', 'cache', 'prefix', 'server', 'token', 'answer', 'question', 'turn', 'graph', 'value', 'table'];

/** 1–4 user turns of 0–2 steps each, a third of the steps with two calls side by side. */
function conversations(n: number): Conversation[] {
  const r = mulberry32(35);
  const words = (tokens: number) => Array.from({ length: tokens }, () => WORDS[Math.floor(r() * WORDS.length)]).join(' ');
  const name = () => TOOL_NAMES[Math.floor(r() * TOOL_NAMES.length)];
  return Array.from({ length: n }, (_, i) => ({
    id: `a${i}`,
    system: `You are agent ${i}. ${words(60 + Math.floor(r() * 200))}`,
    turns: Array.from({ length: 1 + Math.floor(r() * MAX_TURNS) }, (_, k) => {
      const steps = Array.from({ length: Math.floor(r() * 3) }, () => (r() < 1 / 3 ? [name(), name()] : [name()]));
      const marker = steps.length ? ` [tools=${steps.map((s) => s.join(',')).join('|')}]` : '';
      return { steps, user: `Turn ${k} of ${i}: ${words(40 + Math.floor(r() * 160))} [len=${40 + Math.floor(r() * 120)}]${marker}` };
    }),
  }));
}

/** The source's result of call c of step s in turn k: what regen pairs with the target's call, and what the reference sends. */
const result = (c: Conversation, k: number, s: number, n: number) => `result ${c.id}.${k}.${s}.${n}: ${'rows '.repeat(20)}`;

/** The input line: the source's steps (old ids, old arguments) and results, and an old final answer a turn. */
function inputLine(c: Conversation): string {
  const messages: Message[] = [{ role: 'system', content: c.system }];
  for (const [k, turn] of c.turns.entries()) {
    messages.push({ role: 'user', content: turn.user });
    for (const [s, calls] of turn.steps.entries()) {
      const ids = calls.map((_, n) => `src_${c.id}_${k}_${s}_${n}`);
      messages.push({
        role: 'assistant',
        content: null,
        tool_calls: calls.map((fn, n) => ({ id: ids[n], type: 'function', function: { name: fn, arguments: '{"old": true}' } })),
      });
      for (const [n, id] of ids.entries()) messages.push({ role: 'tool', content: result(c, k, s, n), tool_call_id: id });
    }
    messages.push({ role: 'assistant', content: `an old reply ${k}` });
  }
  return JSON.stringify({ custom_id: c.id, messages, tools: TOOLS });
}

interface Tally {
  wall: number;
  prompt: number;
  cached: number;
  /** Per conversation, each request's prompt and completion tokens in order: the ideal's input. */
  requests: { prompt: number; completion: number }[][];
  latencies: number[];
  /** Slot time in requests over the slots' time from the first request sent to the last answer. */
  busy: number;
}

/** What the servers could at best serve from cache: each request's previous prompt and what it generated (and the end of its turn), no more than its own prompt less one. */
function idealCached(requests: Tally['requests']): number {
  let ideal = 0;
  for (const r of requests) for (let k = 1; k < r.length; k++) ideal += Math.min(r[k].prompt - 1, r[k - 1].prompt + r[k - 1].completion + 1);
  return ideal;
}

async function statsOf(sims: SimProcess[]): Promise<{ prompt: number; cached: number }> {
  const all = await Promise.all(sims.map((s) => s.stats()));
  return { prompt: all.reduce((a, s) => a + s.promptTokens, 0), cached: all.reduce((a, s) => a + s.cachedTokens, 0) };
}

/** The reference: every conversation walked request by request, each to the server SGLang's cache_aware policy picks. */
async function reference(sims: SimProcess[], convs: Conversation[], slots: number, kvTokens: number): Promise<Tally> {
  const router = cacheAwareRouter(sims.length, kvTokens);
  const load = sims.map(() => 0);
  const route = (messages: Message[]): number => router.route(messages, load);
  const requests: Tally['requests'] = convs.map(() => []);
  const latencies: number[] = [];
  const before = await statsOf(sims);
  const started = performance.now();
  let lastAnswer = started;
  let next = 0;
  const ask = async (messages: Message[]) => {
    const server = route(messages);
    load[server]++;
    const t0 = performance.now();
    const res = await fetch(`${sims[server].url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages, tools: TOOLS, ...PLAIN }),
    });
    const body = (await res.json()) as {
      choices: { message: { content: string | null; tool_calls: Call[] | null } }[];
      usage: { prompt_tokens: number; completion_tokens: number };
    };
    latencies.push(performance.now() - t0);
    lastAnswer = Math.max(lastAnswer, performance.now());
    load[server]--;
    const { content, tool_calls } = body.choices[0].message;
    const reply: Message = tool_calls ? { role: 'assistant', content: null, tool_calls } : { role: 'assistant', content };
    router.sent(server, [...messages, reply]);
    return { reply, calls: tool_calls, usage: body.usage };
  };
  const worker = async (): Promise<void> => {
    while (next < convs.length) {
      const i = next++;
      const c = convs[i];
      const messages: Message[] = [{ role: 'system', content: c.system }];
      for (const [k, turn] of c.turns.entries()) {
        messages.push({ role: 'user', content: turn.user });
        for (let s = 0; ; s++) {
          const { reply, calls, usage } = await ask(messages);
          requests[i].push({ prompt: usage.prompt_tokens, completion: usage.completion_tokens });
          messages.push(reply);
          if (!calls) break;
          for (const [n, call] of calls.entries()) messages.push({ role: 'tool', content: result(c, k, s, n), tool_call_id: call.id });
        }
      }
    }
  };
  await Promise.all(Array.from({ length: sims.length * slots }, worker));
  const wall = (performance.now() - started) / 1000;
  const after = await statsOf(sims);
  const busy = latencies.reduce((a, b) => a + b, 0) / (lastAnswer - started) / (sims.length * slots);
  return { wall, prompt: after.prompt - before.prompt, cached: after.cached - before.cached, requests, latencies, busy };
}

/** regen: one `all_assistant` run of the same conversations, their source steps and results on each line. */
async function regenRun(
  base: string,
  sims: SimProcess[],
  convs: Conversation[],
  slots: number,
  outputLines: (uri: string) => Record<string, any>[],
): Promise<Tally> {
  const before = await statsOf(sims);
  const started = performance.now();
  const file = await json<{ id: string }>(base, '/v1/files?filename=agentic.jsonl', {
    method: 'POST',
    headers: { 'content-type': 'application/jsonl' },
    body: `${convs.map(inputLine).join('\n')}\n`,
  });
  const run = await json<{ id: string }>(base, '/v1/runs', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, input: { file_id: file.id }, regenerate: 'all_assistant', quality: false, params: PLAIN }),
  });
  // Slots in use over the run, sampled: the dispatch window is from the first sample with a request in flight to the last.
  const sending: number[] = [];
  const done = await until(
    'the agentic run to finish',
    async () => {
      const [r, endpoints] = await Promise.all([json(base, `/v1/runs/${run.id}`), json(base, '/v1/endpoints')]);
      if (r.status === 'failed' || r.status === 'cancelled' || r.status === 'paused') throw new Error(`run ${run.id} ${r.status}: ${r.status_reason}`);
      if (endpoints.data.some((e: any) => (e.in_flight ?? 0) > 0)) sending.push((performance.now() - started) / 1000);
      return r.status === 'completed' ? r : undefined;
    },
    60 * 60_000,
    POLL_MS,
  );
  const wall = (performance.now() - started) / 1000;
  const dispatching = sending.length ? sending.at(-1)! - sending[0] + POLL_MS / 1000 : wall;
  const after = await statsOf(sims);
  const requests: Tally['requests'] = convs.map(() => []);
  const latencies: number[] = [];
  for (const line of outputLines(done.output_uri)) {
    if (line.flags.length) throw new Error(`${line.custom_id} flagged ${line.flags.join(', ')}: every source step pairs`);
    for (const t of line.turns) {
      requests[Number(String(line.custom_id).slice(1))].push({ prompt: t.usage.prompt_tokens, completion: t.usage.completion_tokens });
      latencies.push(t.latency_ms);
    }
  }
  const busy = latencies.reduce((a, b) => a + b, 0) / 1000 / dispatching / (sims.length * slots);
  return { wall, prompt: after.prompt - before.prompt, cached: after.cached - before.cached, requests, latencies, busy };
}

/**
 * The agentic workload: regen with affinity against the cache-aware reference, each on fresh
 * servers from `startSims`; `base` is a regen with affinity on, and no endpoint registered.
 */
export async function benchAgentic(
  base: string,
  startSims: () => Promise<SimProcess[]>,
  shape: { slots: number; kvTokens: number },
  outputLines: (uri: string) => Record<string, any>[],
): Promise<Figure[]> {
  const convs = conversations(scaled(1000, 40));
  const steps = convs.reduce((n, c) => n + c.turns.reduce((m, t) => m + t.steps.length, 0), 0);
  const turns = convs.reduce((n, c) => n + c.turns.length, 0);
  console.error(`agentic: ${convs.length} conversations, ${turns} user turns, ${steps} tool-call steps`);
  const results: Record<string, Tally & { ideal: number }> = {};
  for (const mode of ['regen, affinity', 'cache-aware reference'] as const) {
    const sims = await startSims();
    const ids: string[] = [];
    try {
      for (const sim of sims) {
        const e = await json<{ id: string }>(base, '/v1/endpoints', {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ url: sim.url, max_concurrency: shape.slots }),
        });
        ids.push(e.id);
      }
      await until('endpoints ready', async () => ((await json(base, '/v1/endpoints')).data.every((e: any) => e.state === 'ready') ? true : undefined), 60_000);
      const got =
        mode === 'regen, affinity' ? await regenRun(base, sims, convs, shape.slots, outputLines) : await reference(sims, convs, shape.slots, shape.kvTokens);
      const t = (results[mode] = { ...got, ideal: idealCached(got.requests) });
      console.error(
        `agentic, ${mode}: wall ${t.wall.toFixed(1)} s, prompt ${t.prompt}, cached ${t.cached}, ideal ${t.ideal}, ` +
          `share ${((100 * t.cached) / Math.max(1, t.ideal)).toFixed(1)}%, busy ${(100 * t.busy).toFixed(1)}% while dispatching, ` +
          `p50 ${Math.round(percentile(t.latencies, 50))} ms, p99 ${Math.round(percentile(t.latencies, 99))} ms`,
      );
    } finally {
      for (const id of ids) await fetch(`${base}/v1/endpoints/${id}`, { method: 'DELETE' });
      await Promise.all(sims.map((s) => s.stop()));
      await sleep(200);
    }
  }
  const t = results['regen, affinity'];
  const ref = results['cache-aware reference'];
  const share = (x: Tally & { ideal: number }) => (100 * x.cached) / Math.max(1, x.ideal);
  return [
    {
      part: 'conversations',
      figure: `agentic (${steps} tool-call steps), regen, affinity: cached share of the ideal (prompt tokens computed ${Math.round((t.prompt - t.cached) / 1000)}k)`,
      regen: share(t),
      baseline: share(ref),
      unit: '%',
      ratio: null,
      target: '≥ 95%',
      ok: share(t) >= 95,
    },
    {
      part: 'conversations',
      figure: `agentic, regen, affinity: wall time vs the reference (p99 request ${Math.round(percentile(t.latencies, 99))} ms)`,
      regen: t.wall,
      baseline: ref.wall,
      unit: 's',
      ratio: ref.wall / t.wall,
      target: '≥ 0.95',
      ok: ref.wall / t.wall >= 0.95,
    },
    {
      part: 'conversations',
      figure: 'agentic, regen, affinity: slot-time busy from the first request to the last answer',
      regen: 100 * t.busy,
      baseline: 100 * ref.busy,
      unit: '%',
      ratio: null,
      target: '≥ 97%',
      ok: t.busy >= 0.97,
    },
  ];
}
