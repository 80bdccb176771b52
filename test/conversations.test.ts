import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { checkDatabase, createRun, digestOf, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';
import { openTestStore } from './support/store.js';

// `regenerate: "all_assistant"` end to end on simulator processes, with a kill -9 of regen in the
// middle: every conversation comes out once, each turn answered from its own regenerated history
// (the simulator's answer starts with a digest of the messages it was sent), and no turn answered
// before the kill is asked again. The conversations under way at the kill go back, after the
// restart, to the endpoints whose prefix caches hold them (the stored affinity_endpoint_id), as the
// turns' endpoint_id and the simulators' cache counters show.

const CONVERSATIONS = 150;
const SHARD_SIZE = 25;
const LATENCY = { 'ttft-ms': 30, 'tokens-per-second': 1000, 'completion-tokens': 24, 'reasoning-tokens': 16, 'enable-cache-report': 1 };

type Message = { role: string; content: string };

interface Conversation {
  id: string;
  /** What regen walks: the system and user messages, as the line gave them. */
  walked: Message[];
  line: string;
}

/** Conversations of 1–6 user turns in the three shapes that carry one, some with a system message, some ending on a user turn. */
function makeConversations(n: number): Conversation[] {
  const out: Conversation[] = [];
  for (let i = 0; i < n; i++) {
    const id = `conv-${i}`;
    const turns = 1 + (i % 6);
    const all: Message[] = i % 4 === 0 ? [{ role: 'system', content: `You are assistant ${i}.` }] : [];
    for (let k = 0; k < turns; k++) {
      all.push({ role: 'user', content: `Conversation ${i}, turn ${k}: what follows ${i * 7 + k}?` });
      // Every third conversation ends on a user turn: it gets answered too.
      if (k < turns - 1 || i % 3 !== 0) all.push({ role: 'assistant', content: `an old model's reply ${k}` });
    }
    const walked = all.filter((m) => m.role !== 'assistant');
    let line: string;
    if (i % 3 === 0) line = JSON.stringify({ custom_id: id, messages: all });
    else if (i % 3 === 1) {
      const from = { system: 'system', user: 'human', assistant: 'gpt' } as Record<string, string>;
      line = JSON.stringify({ id, conversations: all.map((m) => ({ from: from[m.role], value: m.content })) });
    } else line = JSON.stringify({ id, conversations: all });
    out.push({ id, walked, line });
  }
  return out;
}

/** Lines regen cannot walk turn by turn, each with the code its refusal must carry. */
const UNWALKABLE: [string, string][] = [
  [
    JSON.stringify({
      custom_id: 'bad-tool',
      messages: [
        { role: 'user', content: 'hi' },
        { role: 'tool', content: '42', tool_call_id: 'x' },
      ],
    }),
    'unwalkable_conversation',
  ],
  [
    JSON.stringify({
      custom_id: 'bad-first',
      messages: [
        { role: 'assistant', content: 'hello' },
        { role: 'user', content: 'hi' },
      ],
    }),
    'unwalkable_conversation',
  ],
  [
    JSON.stringify({
      custom_id: 'bad-calls',
      messages: [
        { role: 'user', content: 'weather?' },
        // The deprecated single call: a call regen cannot pair (tool_calls are walked, "Agentic conversations").
        { role: 'assistant', content: '', function_call: { name: 'w', arguments: '{}' } },
      ],
    }),
    'unwalkable_conversation',
  ],
  [
    JSON.stringify({
      id: 'bad-observation',
      conversations: [
        { from: 'human', value: 'hi' },
        { from: 'observation', value: '{}' },
      ],
    }),
    'unwalkable_conversation',
  ],
  [JSON.stringify({ custom_id: 'bad-role', messages: [{ role: 'bot', content: 'hi' }] }), 'invalid_role'],
];

const data = tempDir('regen-conv-');
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
/** Prompt tokens the simulators were asked, and those of them their prefix caches served. */
const cacheAtSims = async () => {
  const all = await Promise.all(sims.map((s) => s.stats()));
  return { prompt: all.reduce((n, s) => n + s.promptTokens, 0), cached: all.reduce((n, s) => n + s.cachedTokens, 0) };
};

/**
 * Checks one output line against its input: the regenerated conversation is the input's system
 * and user messages, each user message followed by a new reply, and each reply answers the
 * messages of its own turn: the ones before it, with the replies regenerated before it.
 */
function checkLine(line: any, c: Conversation): void {
  const users = c.walked.filter((m) => m.role === 'user').length;
  expect(line.turns).toHaveLength(users);
  const expected: unknown[] = [];
  const sent: unknown[] = [];
  let reply = 0;
  for (const m of c.walked) {
    expected.push(m);
    sent.push(m);
    if (m.role !== 'user') continue;
    const got = line.messages[expected.length];
    expect(got.role).toBe('assistant');
    expect(got.content.startsWith(`Answer ${digestOf(sent)}: `), `${c.id} turn ${reply}: ${got.content.slice(0, 30)}`).toBe(true);
    expect(typeof got.reasoning_content).toBe('string');
    expected.push({ role: 'assistant', content: got.content, reasoning_content: got.reasoning_content });
    // The next turn is asked with this reply's content, never its reasoning.
    sent.push({ role: 'assistant', content: got.content });
    reply++;
  }
  expect(line.messages).toEqual(expected);
  const last = line.messages.at(-1);
  expect(line.content).toBe(last.content);
  expect(line.reasoning_content).toBe(last.reasoning_content);
  const sum = (f: string) => line.turns.reduce((n: number, t: any) => n + t.usage[f], 0);
  expect(line.usage.completion_tokens).toBe(sum('completion_tokens'));
  expect(line.usage.prompt_tokens).toBe(sum('prompt_tokens'));
  for (const t of line.turns) {
    expect(t.finish_reason).toBe('stop');
    expect(typeof t.endpoint_id).toBe('string');
    expect(t.attempts).toBeGreaterThanOrEqual(1);
    expect(t.flags).toEqual([]);
  }
  expect(line.endpoint_id).toBe(line.turns.at(-1).endpoint_id);
}

describe('conversations regenerated turn by turn through a kill -9', () => {
  it('answers every turn once, from its own regenerated history, and writes each conversation once', async () => {
    const conversations = makeConversations(CONVERSATIONS);
    const byId = new Map(conversations.map((c) => [c.id, c]));
    const turns = conversations.reduce((n, c) => n + c.walked.filter((m) => m.role === 'user').length, 0);
    const jsonl = [...conversations.map((c) => c.line), ...UNWALKABLE.map(([l]) => l)].join('\n') + '\n';

    server = await spawnServer(data.dir);
    for (const s of sims) await registerEndpoint(server.url, s.url);
    const fileId = await uploadFile(server.url, jsonl);
    const { id } = await createRun(server.url, {
      model: 'sim-model',
      input: { file_id: fileId },
      shard_size: SHARD_SIZE,
      regenerate: 'all_assistant',
      on_invalid_line: 'skip',
      params: { chat_template_kwargs: { enable_thinking: true } },
    });

    // Killed once enough turns are answered that conversations are under way everywhere.
    const url = server.url;
    const seen = await waitFor(
      `run ${id} to answer 40% of its turns`,
      async () => {
        const run = (await call(url, `/v1/runs/${id}`)).body;
        return run.turns?.completed >= 0.4 * turns ? run : undefined;
      },
      90_000,
      20,
    );
    expect(seen.status).toBe('in_progress');
    expect(seen.turns.total).toBe(turns);
    // Conversations start longest first unless the run says otherwise: the run's tail is its longest chain of turns.
    expect(seen.dispatch_order).toBe('length_aware');
    await server.kill('SIGKILL');
    // What the killed process left: its leases are the turns that were in flight (or claimed) at the kill.
    const left = await checkDatabase(data.dir, id);
    const db = await openTestStore(data.dir);
    const [{ committed }] = (await db.exec<{ committed: number }>('select count(*) as committed from sample_turns where run_id = ?', [id])).rows.map((r) => ({
      committed: Number(r.committed),
    }));
    const [{ line_errors }] = (await db.exec<{ line_errors: unknown }>('select line_errors from runs where id = ?', [id])).rows;
    // The turns each conversation had answered at the kill.
    const answeredAtKill = new Map<string, number>();
    for (const r of (
      await db.exec<{ customId: string }>('select s.custom_id as "customId" from sample_turns t join samples s on s.id = t.sample_id where t.run_id = ?', [id])
    ).rows) {
      answeredAtKill.set(r.customId, (answeredAtKill.get(r.customId) ?? 0) + 1);
    }
    await db.close();
    const lineErrors = (typeof line_errors === 'string' ? JSON.parse(line_errors) : line_errors) as { line: number; code: string; message: string }[];
    expect(lineErrors.map((e) => e.code)).toEqual(UNWALKABLE.map(([, code]) => code));
    expect(lineErrors.map((e) => e.line)).toEqual(UNWALKABLE.map((_, i) => CONVERSATIONS + 1 + i));
    expect(committed).toBeGreaterThanOrEqual(seen.turns.completed);
    expect(left.completed).toBeLessThan(CONVERSATIONS);
    // The kill interrupted turns in flight.
    expect(left.in_progress).toBeGreaterThan(0);
    const askedBeforeKill = await requestsAtSims();
    const cacheBeforeKill = await cacheAtSims();

    server = await spawnServer(data.dir);
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: CONVERSATIONS, completed: CONVERSATIONS, failed: 0 });
    expect(done.turns).toEqual({ total: turns, completed: turns, in_flight: 0, failed: 0, tool_steps: 0 });
    expect(done.invalid_lines.count).toBe(UNWALKABLE.length);

    // Every turn asked once, but for those in flight at the kill: asked again after the restart.
    const asked = await requestsAtSims();
    expect(asked).toBeGreaterThanOrEqual(turns);
    expect(asked).toBeLessThanOrEqual(turns + left.in_progress);
    // The turns answered and committed before the kill were not asked again: what was asked after
    // the restart is at most what was left, with the ones in flight.
    expect(asked - askedBeforeKill).toBeLessThanOrEqual(turns - committed + left.in_progress);

    const cacheAfter = await cacheAtSims();

    const stores = new Stores({ forcePathStyle: false });
    const store = stores.forUri(done.output_uri);
    const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
    const written = new Set<string>();
    const lines: any[] = [];
    for (const shard of manifest.shards) {
      if (!shard.key) continue;
      for (const text of (await store.get(shard.key)).toString('utf8').trimEnd().split('\n')) {
        const line = JSON.parse(text);
        expect(written.has(line.custom_id), `${line.custom_id} written twice`).toBe(false);
        written.add(line.custom_id);
        checkLine(line, byId.get(line.custom_id)!);
        lines.push(line);
      }
      expect(shard.errors_key).toBeNull();
    }
    stores.close();
    expect(written.size).toBe(CONVERSATIONS);

    // Affinity across the restart. A conversation under way at the kill (some turns answered, not
    // all) has its next turn asked after the restart: it goes to the endpoint that answered the
    // turn before, where its prefix is cached. A turn moves only when its endpoint is not ready or
    // after ~2 s with nothing else due, hence a large share, not all.
    const resumed = lines.filter((l) => (answeredAtKill.get(l.custom_id) ?? 0) > 0 && answeredAtKill.get(l.custom_id)! < l.turns.length);
    expect(resumed.length).toBeGreaterThanOrEqual(10);
    const stayed = resumed.filter((l) => {
      const k = answeredAtKill.get(l.custom_id)!;
      return l.turns[k].endpoint_id === l.turns[k - 1].endpoint_id;
    });
    expect(stayed.length / resumed.length, `${stayed.length} of ${resumed.length} resumed conversations on their endpoint`).toBeGreaterThanOrEqual(0.9);
    // Every later turn asked after the restart, likewise.
    const later: [any, any][] = [];
    for (const l of lines) for (let k = Math.max(1, answeredAtKill.get(l.custom_id) ?? 0); k < l.turns.length; k++) later.push([l.turns[k], l.turns[k - 1]]);
    const kept = later.filter(([t, before]) => t.endpoint_id === before.endpoint_id).length;
    expect(kept / later.length, `${kept} of ${later.length} later turns after the restart on their endpoint`).toBeGreaterThanOrEqual(0.9);
    // What the simulators' prefix caches served after the restart, against the ideal (thinking on:
    // each later turn finds its previous turn's prompt cached). The turns in flight at the kill
    // were asked again, so the ideal counts only the ones asked once after it.
    let ideal = 0;
    for (const [t, before] of later) ideal += Math.min(t.usage.prompt_tokens - 1, before.usage.prompt_tokens);
    const cachedAfter = cacheAfter.cached - cacheBeforeKill.cached;
    expect(cachedAfter / ideal, `cached ${cachedAfter} of an ideal ${ideal} after the restart`).toBeGreaterThanOrEqual(0.9);
    // Each later turn's usage says what the cache served (--enable-cache-report).
    expect(later.every(([t]) => t.usage.cached_tokens > 0)).toBe(true);

    // A sample shows its turns.
    const sample = (await call(server.url, `/v1/runs/${id}/samples/conv-5`)).body;
    expect(sample.turns).toHaveLength(6);
    expect(sample.turns.map((t: any) => t.index)).toEqual([0, 1, 2, 3, 4, 5]);
    expect(sample.messages).toEqual(byId.get('conv-5')!.walked);
  });
});
