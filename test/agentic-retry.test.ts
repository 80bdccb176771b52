import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Stores } from '../src/storage/index.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, tempDir } from './support/server.js';
import { createRun, digestOf, expectCountersMatchRecount, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// `retry` with `only: "flagged"` on an agentic run: a line cut by tool_mismatch is asked again from
// its unpairable step, with the regenerated history before it (its complete user turns and the
// steps of the unfinished turn that paired), and nothing before that step is asked again. The
// simulator calls the tools a user turn's "[tools=…]" marker names whatever the seed, so the step
// cannot be paired the second time either: the line comes out as it was, counted once.

const CONVERSATIONS = 30;
const TOOLS = ['search', 'fetch', 'lookup'].map((name) => ({
  type: 'function',
  function: { name, description: `the ${name} tool`, parameters: { type: 'object', properties: {} } },
}));
const PLAIN = { chat_template_kwargs: { enable_thinking: false } };

type Kind = 'late' | 'first' | 'paired';

/**
 * Two user turns each; the second calls search then fetch. Its source: both steps ("paired"), a
 * second step that calls lookup (a "late" mismatch, at step 1, after a step that pairs), or no
 * step at all (a mismatch at the turn's "first" step).
 */
function line(i: number, kind: Kind): string {
  const id = `retry-${i}`;
  const step = (s: number, name: string) => [
    { role: 'assistant', content: null, tool_calls: [{ id: `src_${i}_${s}`, type: 'function', function: { name, arguments: '{}' } }] },
    { role: 'tool', content: `result ${i}.${s}`, tool_call_id: `src_${i}_${s}` },
  ];
  const steps = kind === 'paired' ? [...step(0, 'search'), ...step(1, 'fetch')] : kind === 'late' ? [...step(0, 'search'), ...step(1, 'lookup')] : [];
  const messages = [
    { role: 'user', content: `Question ${i}, no tools. [len=12]` },
    { role: 'assistant', content: 'an old reply' },
    { role: 'user', content: `Question ${i}, with tools [tools=search|fetch] [len=12]` },
    ...steps,
    { role: 'assistant', content: 'an old reply' },
  ];
  return JSON.stringify({ custom_id: id, messages, tools: TOOLS });
}

const kindOf = (i: number): Kind => (['late', 'first', 'paired'] as const)[i % 3];
/** Requests each kind asks: turn 0, then the second turn's steps up to the unpairable one, or both steps and the answer. */
const ASKED: Record<Kind, number> = { late: 3, first: 2, paired: 4 };
/** The requests of the unfinished turn that a retry from the unpairable step asks again: that step alone. */
const ASKED_AGAIN: Record<Kind, number> = { late: 1, first: 1, paired: 0 };

const data = tempDir('regen-agentic-retry-');
let sim: SimProcess;
let server: Awaited<ReturnType<typeof startTestServer>>;

beforeAll(async () => {
  // Paced: a turn takes tens of milliseconds, so the run cannot end before the checks below read it.
  sim = await spawnSimulator({ model: 'sim-model', 'ttft-ms': 20, 'tokens-per-second': 600, 'max-running': 8, 'reasoning-tokens': 0, seed: 3 });
  server = await startTestServer({}, data.dir);
  await registerEndpoint(server.url, sim.url);
});

afterAll(async () => {
  await server?.cleanup();
  await sim?.stop();
  data.cleanup();
});

async function outputOf(uri: string): Promise<Map<string, any>> {
  const stores = new Stores({ forcePathStyle: false });
  try {
    const store = stores.forUri(uri);
    const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
    const lines = new Map<string, any>();
    for (const shard of manifest.shards) {
      expect(shard.errors_key).toBeNull();
      for (const text of (await store.get(shard.key)).toString('utf8').trimEnd().split('\n')) {
        const l = JSON.parse(text);
        expect(lines.has(l.custom_id), `${l.custom_id} written twice`).toBe(false);
        lines.set(l.custom_id, l);
      }
    }
    return lines;
  } finally {
    stores.close();
  }
}

describe('retrying the flagged lines of an agentic run', () => {
  it('asks a tool_mismatch line again from its unpairable step, from the history before it, and nothing else', async () => {
    const kinds = Array.from({ length: CONVERSATIONS }, (_, i) => kindOf(i));
    const cut = kinds.filter((k) => k !== 'paired').length;
    const fileId = await uploadFile(server.url, `${kinds.map((k, i) => line(i, k)).join('\n')}\n`);
    const run = await createRun(server.url, {
      model: 'sim-model',
      input: { file_id: fileId },
      regenerate: 'all_assistant',
      params: PLAIN,
      shard_size: 10,
    });
    const first = await waitForStatus(server.url, run.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(first.status, first.status_reason).toBe('completed');
    expect(first.quality.by_flag.tool_mismatch).toBe(cut);
    const askedFirst = (await sim.stats()).requests;
    expect(askedFirst).toBe(kinds.reduce((n, k) => n + ASKED[k], 0));
    const before = await outputOf(first.output_uri);

    const retried = await call(server.url, `/v1/runs/${run.id}/retry`, { method: 'POST', json: { only: 'flagged' } });
    expect(retried.status, JSON.stringify(retried.body)).toBe(200);
    expect(retried.body.request_counts.completed).toBe(CONVERSATIONS - cut);
    const done = await waitForStatus(server.url, run.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status, done.status_reason).toBe('completed');

    // One request a cut line, its unpairable step: not its complete turn, not the step that paired before it.
    expect((await sim.stats()).requests - askedFirst).toBe(kinds.reduce((n, k) => n + ASKED_AGAIN[k], 0));
    expect(done.request_counts).toMatchObject({ total: CONVERSATIONS, completed: CONVERSATIONS, failed: 0 });
    expect(done.quality.by_flag.tool_mismatch).toBe(cut);
    expect(done.turns).toMatchObject({ completed: first.turns.completed, tool_steps: first.turns.tool_steps, in_flight: 0 });
    await expectCountersMatchRecount(server.url, done);

    const after = await outputOf(done.output_uri);
    expect(after.size).toBe(CONVERSATIONS);
    for (const [i, kind] of kinds.entries()) {
      const id = `retry-${i}`;
      const l = after.get(id);
      expect(l.flags, id).toEqual(kind === 'paired' ? [] : ['tool_mismatch']);
      if (kind === 'paired') continue;
      // Cut at its complete first turn, as before the retry.
      expect(l.messages, id).toEqual(before.get(id).messages);
      expect(l.messages.map((m: any) => m.role)).toEqual(['user', 'assistant']);
      // The step asked again was asked from its own history: the first turn, the second user
      // message, and for a late mismatch the step that paired with its result under the target's id.
      const detail = (await call(server.url, `/v1/runs/${run.id}/samples/${id}`)).body;
      const steps = detail.turns.filter((t: any) => t.turn === 1);
      expect(steps.map((t: any) => t.step)).toEqual(kind === 'late' ? [0, 1] : [0]);
      // Thinking off: an answer goes back as its content, a step as its content (none) and its calls.
      const sent: unknown[] = [
        l.messages[0],
        { role: 'assistant', content: l.messages[1].content },
        { role: 'user', content: `Question ${i}, with tools [tools=search|fetch] [len=12]` },
      ];
      if (kind === 'late') {
        sent.push({ role: 'assistant', content: null, tool_calls: steps[0].tool_calls });
        sent.push({ role: 'tool', content: `result ${i}.0`, tool_call_id: steps[0].tool_calls[0].id });
      }
      const asked = steps.at(-1);
      expect(asked.flags).toContain('tool_mismatch');
      expect(JSON.parse(asked.tool_calls[0].function.arguments), id).toEqual({ digest: digestOf(sent), call: 0 });
    }
  }, 180_000);
});
