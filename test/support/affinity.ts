import { expect } from 'vitest';
import { mulberry32 } from '../../src/domain/forecast.js';
import { Stores } from '../../src/storage/index.js';
import { digestOf } from './runner-checks.js';

// What the affinity tests share: multi-turn conversations regenerated turn by turn on simulators
// with prefix caches, and how much of each turn's prompt came from the cache against what could.

/** Simulator flags: a prefix cache that reports its hits, no thinking (each answer is part of the next turn's prefix). */
export const CACHE_SIM = {
  model: 'affinity-sim',
  'ttft-ms': 20,
  'tokens-per-second': 600,
  'max-running': 32,
  'enable-cache-report': 1,
  'reasoning-tokens': 0,
  'keep-alive-ms': 120_000,
};
export const PLAIN = { chat_template_kwargs: { enable_thinking: false } };

type Message = { role: string; content: string };

export interface Conversation {
  id: string;
  /** The system and user messages regen walks. */
  walked: Message[];
  /** Agentic conversations: per user turn, the functions each of its tool-call steps calls. */
  steps?: string[][][];
}

/** The tools agentic lines offer. */
export const TOOLS = ['search', 'calc', 'fetch'].map((name) => ({
  type: 'function',
  function: { name, description: `the ${name} tool`, parameters: { type: 'object', properties: {} } },
}));

/** The source's result of call n of step s in user turn k of conversation `id`: what regen pairs with the target's call n. */
const toolResult = (id: string, k: number, s: number, n: number) => `result ${id}.${k}.${s}.${n}: ${'rows '.repeat(12)}`;

const WORDS = ['data', 'model', 'cache', 'prefix', 'server', 'token', 'answer', 'question', 'turn', 'graph', 'value', 'table'];

/** `n` conversations of 2–5 user turns, each with a system prompt of its own, seeded by `tag`. */
export function makeConversations(n: number, tag: string): { conversations: Conversation[]; jsonl: string } {
  const r = mulberry32([...tag].reduce((h, ch) => h * 31 + ch.charCodeAt(0), 7));
  const words = (tokens: number) => Array.from({ length: tokens }, () => WORDS[Math.floor(r() * WORDS.length)]).join(' ');
  const conversations = Array.from({ length: n }, (_, i) => {
    const turns = 2 + Math.floor(r() * 4);
    const walked: Message[] = [{ role: 'system', content: `You are ${tag} assistant ${i}. ${words(60 + Math.floor(r() * 120))}` }];
    for (let k = 0; k < turns; k++)
      walked.push({ role: 'user', content: `Turn ${k} of ${tag}-${i}: ${words(30 + Math.floor(r() * 90))} [len=${20 + Math.floor(r() * 40)}]` });
    return { id: `${tag}-${i}`, walked };
  });
  const jsonl =
    conversations
      .map((c) =>
        JSON.stringify({ custom_id: c.id, messages: c.walked.flatMap((m) => (m.role === 'user' ? [m, { role: 'assistant', content: 'an old reply' }] : [m])) }),
      )
      .join('\n') + '\n';
  return { conversations, jsonl };
}

/**
 * `n` agentic conversations of 2–4 user turns, each turn of 0–2 tool-call steps (the simulator
 * calls what a turn's "[tools=…]" marker names), a third of the steps with two calls side by side;
 * the source's steps name the same functions, so every step pairs. Seeded by `tag`.
 */
export function makeAgenticConversations(n: number, tag: string): { conversations: Conversation[]; jsonl: string; requests: number } {
  const r = mulberry32([...tag].reduce((h, ch) => h * 31 + ch.charCodeAt(0), 11));
  const words = (tokens: number) => Array.from({ length: tokens }, () => WORDS[Math.floor(r() * WORDS.length)]).join(' ');
  const name = () => TOOLS[Math.floor(r() * TOOLS.length)].function.name;
  let requests = 0;
  const lines: string[] = [];
  const conversations = Array.from({ length: n }, (_, i) => {
    const id = `${tag}-${i}`;
    const walked: Message[] = [{ role: 'system', content: `You are ${tag} agent ${i}. ${words(60 + Math.floor(r() * 120))}` }];
    const source: unknown[] = [walked[0]];
    const steps: string[][][] = [];
    for (let k = 0, turns = 2 + Math.floor(r() * 3); k < turns; k++) {
      const turn = Array.from({ length: Math.floor(r() * 3) }, () => (r() < 1 / 3 ? [name(), name()] : [name()]));
      const marker = turn.length ? ` [tools=${turn.map((calls) => calls.join(',')).join('|')}]` : '';
      const user = { role: 'user', content: `Turn ${k} of ${id}: ${words(30 + Math.floor(r() * 90))} [len=${20 + Math.floor(r() * 40)}]${marker}` };
      walked.push(user);
      steps.push(turn);
      requests += turn.length + 1;
      source.push(user);
      for (const [s, calls] of turn.entries()) {
        const ids = calls.map((_, c) => `src_${id}_${k}_${s}_${c}`);
        source.push({
          role: 'assistant',
          content: null,
          tool_calls: calls.map((fn, c) => ({ id: ids[c], type: 'function', function: { name: fn, arguments: '{}' } })),
        });
        for (const [c, callId] of ids.entries()) source.push({ role: 'tool', content: toolResult(id, k, s, c), tool_call_id: callId });
      }
      source.push({ role: 'assistant', content: 'an old reply' });
    }
    lines.push(JSON.stringify({ custom_id: id, messages: source, tools: TOOLS }));
    return { id, walked, steps };
  });
  return { conversations, jsonl: `${lines.join('\n')}\n`, requests };
}

/**
 * Reads a finished conversation run's output and checks it: every conversation exactly once, each
 * turn and step answered from its own regenerated history (the simulator's answer starts with a
 * digest of the messages it was sent, a step's call arguments hold it), each tool result the
 * source's under the target's call id. Returns the lines.
 */
export async function readConversations(outputUri: string, conversations: Conversation[], s3Endpoint?: string): Promise<any[]> {
  const byId = new Map(conversations.map((c) => [c.id, c]));
  const stores = new Stores(s3Endpoint ? { endpoint: s3Endpoint, forcePathStyle: true } : { forcePathStyle: false });
  const lines: any[] = [];
  try {
    const store = stores.forUri(outputUri);
    const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
    for (const shard of manifest.shards) {
      expect(shard.errors_key).toBeNull();
      if (!shard.key) continue;
      for (const text of (await store.get(shard.key)).toString('utf8').trimEnd().split('\n')) lines.push(JSON.parse(text));
    }
  } finally {
    stores.close();
  }
  const seen = new Set<string>();
  for (const line of lines) {
    expect(seen.has(line.custom_id), `${line.custom_id} written twice`).toBe(false);
    seen.add(line.custom_id);
    const c = byId.get(line.custom_id);
    expect(c, `unknown custom_id ${line.custom_id}`).toBeDefined();
    expect(line.flags, c!.id).toEqual([]);
    const sent: unknown[] = [];
    let at = 0;
    let k = -1;
    for (const m of c!.walked) {
      sent.push(m);
      expect(line.messages[at++]).toEqual(m);
      if (m.role !== 'user') continue;
      k++;
      for (const [s, calls] of (c!.steps?.[k] ?? []).entries()) {
        const step = line.messages[at++];
        expect(
          step.tool_calls.map((t: any) => t.function.name),
          `${c!.id} turn ${k} step ${s}`,
        ).toEqual(calls);
        for (const [n, call] of step.tool_calls.entries()) expect(JSON.parse(call.function.arguments)).toEqual({ digest: digestOf(sent), call: n });
        // Thinking off: the step goes back as its content (none) and its calls.
        sent.push({ role: 'assistant', content: null, tool_calls: step.tool_calls });
        for (const [n, call] of step.tool_calls.entries()) {
          const result = line.messages[at++];
          expect(result).toEqual({ role: 'tool', content: toolResult(c!.id, k, s, n), tool_call_id: call.id });
          sent.push(result);
        }
      }
      const reply = line.messages[at++];
      expect(reply.content.startsWith(`Answer ${digestOf(sent)}: `), `${c!.id}: ${reply.content.slice(0, 30)}`).toBe(true);
      sent.push({ role: 'assistant', content: reply.content });
    }
    expect(at, c!.id).toBe(line.messages.length);
  }
  expect(seen.size).toBe(conversations.length);
  return lines;
}

/**
 * The prompt tokens the answers say came from the cache, and the ideal: every request (a turn,
 * or a tool-call step) after the first finds its previous request's prompt and answer cached (the
 * answer's tokens, a step's call message, and the end-of-turn token), no more than its own prompt
 * less the token a server always computes.
 * `moved` counts the requests sent to another endpoint than the one before, `movedIdeal` their part
 * of the ideal (what a move costs), and `movedAgain` the conversations that moved more than once.
 * `afterStep` is the same sum over the requests that follow a tool-call step where it was answered:
 * those find the step's call message cached, or lose a few percent of their prompt.
 */
export function cacheShare(lines: any[]): {
  cached: number;
  ideal: number;
  share: number;
  turns: number;
  moved: number;
  movedIdeal: number;
  movedAgain: number;
  afterStep: { cached: number; ideal: number };
} {
  let cached = 0;
  let ideal = 0;
  let turns = 0;
  let moved = 0;
  let movedIdeal = 0;
  let movedAgain = 0;
  const afterStep = { cached: 0, ideal: 0 };
  for (const line of lines) {
    let moves = 0;
    for (const [k, t] of line.turns.entries()) {
      turns++;
      cached += t.usage.cached_tokens;
      if (k === 0) continue;
      const before = line.turns[k - 1];
      const best = Math.min(t.usage.prompt_tokens - 1, before.usage.prompt_tokens + before.usage.completion_tokens + 1);
      ideal += best;
      if (t.endpoint_id === before.endpoint_id) {
        if (before.finish_reason !== 'tool_calls') continue;
        afterStep.cached += t.usage.cached_tokens;
        afterStep.ideal += best;
        continue;
      }
      moved++;
      movedIdeal += best;
      moves++;
    }
    if (moves > 1) movedAgain++;
  }
  return { cached, ideal, share: cached / ideal, turns, moved, movedIdeal, movedAgain, afterStep };
}
