import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { checkDatabase, createRun, digestOf, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// Agentic conversations (`regenerate: "all_assistant"` with tool calls) end to end on simulator
// processes, with a kill -9 of regen in the middle. The simulator calls the tools a user turn's
// "[tools=…]" marker names, one step after another, each call's arguments holding the digest of
// the messages it was asked with: so every step is checked to have been asked from its own
// regenerated history, and every tool result to be the source's, under the target's call id.
// Some sources do not match what the target calls: those lines are cut at their last complete
// user turn and flagged, or failed when their first turn cannot be paired.

const CONVERSATIONS = 200;
const SHARD_SIZE = 40;
const LATENCY = { 'ttft-ms': 20, 'tokens-per-second': 1500, 'completion-tokens': 16, 'reasoning-tokens': 12, 'enable-cache-report': 1 };
const TOOLS = ['search', 'calc', 'fetch', 'lookup'].map((name) => ({
  type: 'function',
  function: { name, description: `the ${name} tool`, parameters: { type: 'object', properties: {} } },
}));

type Message = { role: string; content: string | null; [k: string]: unknown };

interface Conversation {
  id: string;
  line: string;
  /** Per user turn: the user message, the target's steps (the functions each calls), the source's results by [step][call]. */
  turns: { user: Message; target: string[][]; results: string[][] }[];
  system: Message | null;
  /** The first user turn whose steps cannot be paired, or null. */
  mismatch: number | null;
  /** The requests the target is asked, the mismatching step included, and the steps among them. */
  requests: number;
  steps: number;
}

/** 1–3 user turns of 0–2 steps (one with parallel calls); a tenth of the sources renames a call, a tenth lacks a step, some take an extra one. */
function makeConversations(n: number): Conversation[] {
  const out: Conversation[] = [];
  for (let i = 0; i < n; i++) {
    const id = `agent-${i}`;
    const system = i % 4 === 1 ? { role: 'system', content: `You are agent ${i}.` } : null;
    const messages: Message[] = system ? [system] : [];
    const sharegpt: { from: string; value: string }[] = system ? [{ from: 'system', value: system.content as string }] : [];
    const turns: Conversation['turns'] = [];
    let mismatch: number | null = null;
    let requests = 0;
    let steps = 0;
    const userTurns = 1 + (i % 3);
    for (let k = 0; k < userTurns; k++) {
      const target = [i % 4 === 0 ? ['search', 'calc'] : ['search'], ['fetch']].slice(0, (i + k) % 3);
      // The source's steps: as the target's, but a renamed call (i % 10 == 7, at the last turn) or a
      // missing step (i % 10 == 9, at the first turn) where the target takes one; an extra step otherwise sometimes.
      let source = target.map((calls) => [...calls]);
      if (i % 10 === 7 && k === userTurns - 1 && source.length) source[0][0] = 'lookup';
      if (i % 10 === 9 && k === 0 && source.length) source = source.slice(0, -1);
      if (i % 10 === 3) source.push(['lookup']);
      const results = source.map((calls, s) => calls.map((_, c) => `result ${i}.${k}.${s}.${c}`));
      const user = { role: 'user', content: `Agent ${i}, turn ${k}: ${target.length ? `[tools=${target.map((c) => c.join(',')).join('|')}]` : 'no tools'}` };
      turns.push({ user, target, results });
      messages.push(user);
      sharegpt.push({ from: 'human', value: user.content as string });
      for (const [s, calls] of source.entries()) {
        const ids = calls.map((_, c) => `src_${i}_${k}_${s}_${c}`);
        messages.push({
          role: 'assistant',
          content: null,
          tool_calls: calls.map((name, c) => ({ id: ids[c], type: 'function', function: { name, arguments: `{"old": ${c}}` } })),
        });
        sharegpt.push({ from: 'function_call', value: JSON.stringify(calls.map((name, c) => ({ name, arguments: { old: c } }))) });
        for (const [c, result] of results[s].entries()) {
          messages.push({ role: 'tool', content: result, tool_call_id: ids[c] });
          sharegpt.push({ from: 'observation', value: result });
        }
      }
      messages.push({ role: 'assistant', content: `an old model's answer ${k}` });
      sharegpt.push({ from: 'gpt', value: `an old model's answer ${k}` });
      if (mismatch !== null) continue;
      const bad = target.findIndex((calls, s) => !source[s] || source[s].length !== calls.length || source[s].some((name, c) => name !== calls[c]));
      if (bad >= 0) {
        mismatch = k;
        requests += bad + 1;
        steps += bad + 1;
      } else {
        requests += target.length + 1;
        steps += target.length;
      }
    }
    let line: string;
    if (i % 5 === 2) line = JSON.stringify({ id, conversations: sharegpt, tools: JSON.stringify(TOOLS) });
    else if (i % 5 === 4) line = JSON.stringify({ id, conversations: messages, tools: TOOLS });
    else line = JSON.stringify({ custom_id: id, messages, tools: TOOLS });
    out.push({ id, line, turns, system, mismatch, requests, steps });
  }
  return out;
}

const data = tempDir('regen-agentic-');
const sims: SimProcess[] = [];
let server: ServerProcess | null = null;

beforeAll(async () => {
  sims.push(await spawnSimulator({ ...LATENCY, 'max-running': 8, seed: 1 }));
  sims.push(await spawnSimulator({ ...LATENCY, 'max-running': 8, seed: 2 }));
});

afterAll(async () => {
  await server?.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  data.cleanup();
});

const requestsAtSims = async () => (await Promise.all(sims.map((s) => s.stats()))).reduce((n, s) => n + s.requests, 0);

/**
 * Checks one output line against its conversation: walks its messages, rebuilding what regen
 * must have sent for each request (reasoning kept on the current tool loop's steps only), and
 * checks each step's calls and each answer against the simulator's digest of that history.
 */
function checkLine(line: any, c: Conversation): void {
  const kept = c.mismatch ?? c.turns.length;
  expect(line.tools).toEqual(TOOLS);
  expect(line.metadata).toBeUndefined();
  const sent: any[] = [];
  const expected: unknown[] = [];
  let j = 0;
  const next = () => line.messages[j++];
  if (c.system) expect(next()).toEqual(c.system);
  if (c.system) sent.push(c.system);
  const turnLines: any[] = [];
  for (let k = 0; k < kept; k++) {
    const { user, target, results } = c.turns[k];
    expect(next()).toEqual(user);
    // A new user message closes the loop before it: its steps go back without their reasoning.
    for (const [i, m] of sent.entries()) if (m.role === 'assistant' && 'reasoning_content' in m) sent[i] = withoutReasoning(m);
    sent.push(user);
    for (const [s, calls] of target.entries()) {
      const step = next();
      expect(step.role).toBe('assistant');
      expect(step.content).toBeNull();
      expect(typeof step.reasoning_content).toBe('string');
      expect(step.tool_calls.map((t: any) => t.function.name)).toEqual(calls);
      for (const [n, call] of step.tool_calls.entries()) {
        expect(JSON.parse(call.function.arguments), `${c.id} turn ${k} step ${s} call ${n}`).toEqual({ digest: digestOf(sent), call: n });
        expect(call.id).toMatch(/^call_/);
      }
      sent.push({ role: 'assistant', content: null, reasoning_content: step.reasoning_content, tool_calls: step.tool_calls });
      for (const [n, call] of step.tool_calls.entries()) {
        const result = next();
        expect(result).toEqual({ role: 'tool', content: results[s][n], tool_call_id: call.id });
        sent.push(result);
      }
      turnLines.push({ turn: k, step: s, tool_calls: calls.length, finish_reason: 'tool_calls' });
    }
    const answer = next();
    expect(answer.role).toBe('assistant');
    expect(answer.content.startsWith(`Answer ${digestOf(sent)}: `), `${c.id} turn ${k}: ${answer.content.slice(0, 30)}`).toBe(true);
    sent.push({ role: 'assistant', content: answer.content });
    turnLines.push({ turn: k, step: target.length, finish_reason: 'stop' });
    expected.push(answer);
  }
  expect(j).toBe(line.messages.length);
  expect(line.turns).toMatchObject(turnLines);
  expect(line.content).toBe((expected.at(-1) as any).content);
  expect(line.flags).toEqual(c.mismatch === null ? [] : ['tool_mismatch']);
  // What the prefix cache served each request asked where the one before it was answered, against
  // the request before's prompt: the lower bound (what a step's answer adds is not counted here).
  for (const [k, t] of line.turns.entries()) {
    const before = line.turns[k - 1];
    if (!before || before.endpoint_id !== t.endpoint_id) continue;
    cache.ideal += Math.min(t.usage.prompt_tokens - 1, before.usage.prompt_tokens);
    cache.cached += t.usage.cached_tokens;
  }
}

/** Over every line checked: the cached prompt tokens of requests asked where their conversation's previous one was answered, and the ideal. */
const cache = { cached: 0, ideal: 0 };

const withoutReasoning = ({ reasoning_content: _r, ...m }: any) => m;

describe('agentic conversations regenerated step by step through a kill -9', () => {
  it('asks every step once from its own history, pairs the source results under the target ids, and cuts the unpairable', async () => {
    const conversations = makeConversations(CONVERSATIONS);
    const byId = new Map(conversations.map((c) => [c.id, c]));
    const requests = conversations.reduce((n, c) => n + c.requests, 0);
    const steps = conversations.reduce((n, c) => n + c.steps, 0);
    const failing = conversations.filter((c) => c.mismatch === 0);
    const cut = conversations.filter((c) => c.mismatch !== null && c.mismatch > 0);
    expect(failing.length).toBeGreaterThan(5);
    expect(cut.length).toBeGreaterThan(5);

    server = await spawnServer(data.dir);
    for (const s of sims) await registerEndpoint(server.url, s.url);
    const fileId = await uploadFile(server.url, `${conversations.map((c) => c.line).join('\n')}\n`);
    const { id } = await createRun(server.url, {
      model: 'sim-model',
      input: { file_id: fileId },
      shard_size: SHARD_SIZE,
      regenerate: 'all_assistant',
      params: { chat_template_kwargs: { enable_thinking: true } },
    });
    const url = server.url;
    const seen = await waitFor(
      `run ${id} to answer 40% of its requests`,
      async () => {
        const run = (await call(url, `/v1/runs/${id}`)).body;
        return run.turns?.completed >= 0.4 * requests ? run : undefined;
      },
      90_000,
      20,
    );
    expect(seen.status).toBe('in_progress');
    expect(seen).toMatchObject({ tool_pairing: 'name', on_tool_mismatch: 'truncate', history_reasoning: 'loop' });
    await server.kill('SIGKILL');
    const left = await checkDatabase(data.dir, id);
    expect(left.completed).toBeLessThan(CONVERSATIONS);
    const askedBeforeKill = await requestsAtSims();

    server = await spawnServer(data.dir);
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: CONVERSATIONS, completed: CONVERSATIONS - failing.length, failed: failing.length });
    // A line that fails on its unpairable step counts that request as failed, not answered.
    expect(done.turns).toMatchObject({ completed: requests - failing.length, tool_steps: steps - failing.length, failed: failing.length, in_flight: 0 });
    expect(done.quality.by_flag.tool_mismatch).toBe(cut.length);

    // Every request asked once, but for those in flight at the kill: asked again after the restart.
    const asked = await requestsAtSims();
    expect(asked).toBeGreaterThanOrEqual(requests);
    expect(asked).toBeLessThanOrEqual(requests + left.in_progress);
    expect(asked - askedBeforeKill).toBeLessThanOrEqual(requests - seen.turns.completed + left.in_progress);

    const stores = new Stores({ forcePathStyle: false });
    const store = stores.forUri(done.output_uri);
    const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
    const written = new Set<string>();
    const errors = new Map<string, any>();
    for (const shard of manifest.shards) {
      if (shard.key) {
        for (const text of (await store.get(shard.key)).toString('utf8').trimEnd().split('\n')) {
          const line = JSON.parse(text);
          expect(written.has(line.custom_id), `${line.custom_id} written twice`).toBe(false);
          written.add(line.custom_id);
          checkLine(line, byId.get(line.custom_id)!);
        }
      }
      if (shard.errors_key) {
        for (const text of (await store.get(shard.errors_key)).toString('utf8').trimEnd().split('\n')) {
          const line = JSON.parse(text);
          expect(errors.has(line.custom_id)).toBe(false);
          errors.set(line.custom_id, line);
        }
      }
    }
    stores.close();
    expect(written.size + errors.size).toBe(CONVERSATIONS);
    expect(cache.cached / cache.ideal, `cached ${cache.cached} of an ideal ${cache.ideal}`).toBeGreaterThanOrEqual(0.95);
    expect([...errors.keys()].sort()).toEqual(failing.map((c) => c.id).sort());
    for (const c of failing) {
      const e = errors.get(c.id);
      const step = c.turns[0].target.findIndex((_, s) => s >= c.turns[0].results.length);
      expect(e.error.code).toBe('tool_mismatch');
      expect(e).toMatchObject({ turn: 0, step });
      expect(e.error.message).toMatch(/turn 0 step \d/);
    }
  }, 300_000);
});

describe('a server without a tool-call parser', () => {
  it('pauses a plain run with tools within 300 answers, naming the parser to launch SGLang with', async () => {
    const model = 'Qwen/Qwen3-Coder-30B-A3B-Instruct';
    // Paced (16 at a time, 20 ms each), as the other gate tests are: answered at once, a loaded
    // machine's commits carried so many answers each that the gate first judged past 200 and the
    // run stood at 304 when seen paused.
    const sim = await spawnSimulator({
      model,
      'tool-call-parser': 0,
      'max-running': 16,
      'ttft-ms': 20,
      'completion-tokens': 8,
      'reasoning-tokens': 4,
      seed: 9,
    });
    const dir = tempDir('regen-no-parser-');
    const regen = await spawnServer(dir.dir);
    try {
      await registerEndpoint(regen.url, sim.url, { max_concurrency: 16 });
      // Most lines offer tools and the model calls one; its call lands in content without a parser.
      const lines = Array.from({ length: 1000 }, (_, i) =>
        JSON.stringify({ custom_id: `p-${i}`, messages: [{ role: 'user', content: `question ${i} ${i % 5 ? '[tools=search]' : ''}` }], tools: TOOLS }),
      );
      const fileId = await uploadFile(regen.url, `${lines.join('\n')}\n`);
      // The walk's settings belong to a walk: a plain run that sets one is told so, naming the field; a bad value likewise.
      for (const [body, field] of [
        [{ tool_pairing: 'position' }, 'tool_pairing'],
        [{ regenerate: 'all_assistant', history_reasoning: 'some' }, 'history_reasoning'],
      ] as const) {
        const refused = await call(regen.url, '/v1/runs', { method: 'POST', json: { model, input: { file_id: fileId }, ...body } });
        expect(refused.status, JSON.stringify(refused.body)).toBe(422);
        expect(JSON.stringify(refused.body)).toContain(field);
      }
      const { id } = await createRun(regen.url, { model, input: { file_id: fileId } });
      const paused = await waitForStatus(regen.url, id, ['paused', 'completed', 'failed']);
      expect(paused.status).toBe('paused');
      expect(paused.status_reason).toMatch(/tool_call_in_content/);
      expect(paused.status_reason).toContain('--tool-call-parser qwen3_coder');
      expect(paused.request_counts.completed).toBeLessThanOrEqual(300);
      // The calls stayed in content, and the line says which tools it offered.
      const sample = (await call(regen.url, `/v1/runs/${id}/samples?flag=tool_call_in_content&limit=1`)).body.data[0];
      expect(sample.flags).toContain('tool_call_in_content');
    } finally {
      await regen.kill('SIGKILL');
      await sim.stop();
      dir.cleanup();
    }
  }, 240_000);
});
