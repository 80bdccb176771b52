import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { setAffinity } from '../src/db/samples.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, startTestServer, tempDir } from './support/server.js';
import { openTestStore } from './support/store.js';
import { checkOutput, createRun, listAllSamples, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';
import { CACHE_SIM, cacheShare, makeAgenticConversations, makeConversations, readConversations } from './support/affinity.js';

const MODEL = 'affinity-sim';
const CONVERSATIONS = 200;
const SIM = {
  model: MODEL,
  'ttft-ms': 10,
  'tokens-per-second': 2000,
  'max-running': 8,
  'enable-cache-report': 1,
  'reasoning-tokens': 0,
  'keep-alive-ms': 120_000,
};
const PLAIN = { chat_template_kwargs: { enable_thinking: false } };

type Message = { role: string; content: string };

let server: Awaited<ReturnType<typeof startTestServer>>;
const data = tempDir('regen-affinity-');
const sims: SimProcess[] = [];

beforeAll(async () => {
  sims.push(await spawnSimulator({ ...SIM, seed: 1 }), await spawnSimulator({ ...SIM, seed: 2 }));
  server = await startTestServer({}, data.dir);
});

afterAll(async () => {
  await server?.cleanup();
  await Promise.all(sims.map((s) => s.stop()));
  data.cleanup();
});

/** Turn one of conversation i, asked of `sim` directly: its prompt and answer are then in that server's prefix cache. */
async function firstTurn(sim: SimProcess, i: number): Promise<Message[]> {
  const messages: Message[] = [
    { role: 'system', content: `You answer conversation ${i} with care. ${'Background. '.repeat(40)}` },
    { role: 'user', content: `First question of ${i}: ${'context '.repeat(60)}[len=24]` },
  ];
  const res = await fetch(`${sim.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, messages, ...PLAIN }),
  });
  const answer = (await res.json()).choices[0].message.content as string;
  return [...messages, { role: 'assistant', content: answer }, { role: 'user', content: `Second question of ${i}. [len=24]` }];
}

describe('prefix-cache affinity', () => {
  it('sends each sample to the endpoint that holds its prefix, and reads the run hit rate from real cached_tokens', async () => {
    const base = server.url;
    // Each conversation's first turn lives on one server: even ones on the first, odd on the second.
    const convs = await Promise.all(Array.from({ length: CONVERSATIONS }, (_, i) => firstTurn(sims[i % 2], i)));
    const before = await Promise.all(sims.map((s) => s.stats()));
    const jsonl = convs.map((messages, i) => JSON.stringify({ custom_id: `c${i}`, messages })).join('\n') + '\n';
    // Created before any endpoint exists and paused until the affinity is set, so that nothing is
    // claimed before it: endpoints become ready (and would claim) while it is being written.
    const run = await createRun(base, { model: MODEL, input: { file_id: await uploadFile(base, jsonl) }, params: PLAIN, quality: false, shard_size: 100 });
    await waitForStatus(base, run.id, ['queued']);
    expect((await call(base, `/v1/runs/${run.id}/pause`, { method: 'POST' })).status).toBe(200);

    const eps: { id: string }[] = [];
    for (const sim of sims) eps.push(await registerEndpoint(base, sim.url));
    const db = await openTestStore(data.dir);
    try {
      await setAffinity(db, run.id, new Map(convs.map((_, i) => [`c${i}`, eps[i % 2].id])));
    } finally {
      await db.close();
    }
    expect((await call(base, `/v1/runs/${run.id}/resume`, { method: 'POST' })).status).toBe(200);

    const done = await waitForStatus(base, run.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    expect(done.request_counts.completed).toBe(CONVERSATIONS);

    // Where each landed: its own endpoint, but for the odd one moved after waiting 2 s on a loaded machine.
    const samples = await listAllSamples(base, run.id);
    const home = samples.filter((s) => s.endpoint_id === eps[Number(s.custom_id.slice(1)) % 2].id).length;
    expect(home / CONVERSATIONS).toBeGreaterThanOrEqual(0.95);

    // The hit rate is the answers' own cached_tokens over their prompt tokens, as the servers counted them.
    const out = await checkOutput(new Stores({ forcePathStyle: false }).forUri(done.output_uri), new Map(convs.map((m, i) => [`c${i}`, m])));
    const lines = [...out.lines.values()];
    const prompt = lines.reduce((t, l) => t + l.usage.prompt_tokens, 0);
    const cached = lines.reduce((t, l) => t + l.usage.cached_tokens, 0);
    const after = await Promise.all(sims.map((s) => s.stats()));
    const served = after.reduce((t, s, i) => t + s.cachedTokens - before[i].cachedTokens, 0);
    expect(cached).toBe(served);
    expect(done.cache_hit_rate).toBeCloseTo(cached / prompt, 3);
    // Turn one and its answer are cached: most of turn two's prompt.
    expect(done.cache_hit_rate).toBeGreaterThan(0.8);

    const byEndpoint = (await call(base, `/v1/runs/${run.id}`)).body.cache_by_endpoint;
    expect(byEndpoint.reduce((t: number, e: any) => t + e.cached_tokens, 0)).toBe(cached);
    const endpoint = (await call(base, `/v1/endpoints/${eps[0].id}`)).body;
    expect(endpoint.stats.cache_hit_rate).toBeGreaterThan(0.8);
    // The server's own figure, read from /v1/loads: priming requests and the run's together.
    expect(endpoint.server.cache_hit_rate).toBeGreaterThan(0);
    const metrics = (await call<string>(base, '/metrics')).body;
    expect(metrics).toMatch(new RegExp(`regen_endpoint_cached_tokens_total\\{endpoint_id="${eps[0].id}"\\} [1-9]`));
  });
});

describe('prefix-cache affinity on one process, conversations of several turns', () => {
  const dir = tempDir('regen-affinity-turns-');
  const turnSims: SimProcess[] = [];
  let one: Awaited<ReturnType<typeof startTestServer>>;

  beforeAll(async () => {
    turnSims.push(...(await Promise.all([1, 2, 3, 4].map((seed) => spawnSimulator({ ...CACHE_SIM, seed })))));
    one = await startTestServer({}, dir.dir);
    for (const sim of turnSims) await registerEndpoint(one.url, sim.url, { max_concurrency: 8 });
  });

  afterAll(async () => {
    await one?.cleanup();
    await Promise.all(turnSims.map((s) => s.stop()));
    dir.cleanup();
  });

  it("serves each turn's earlier prompt from the cache of the endpoint that answered it, within 5% of the ideal", async () => {
    const n = 240;
    const { conversations, jsonl } = makeConversations(n, 'one');
    const fileId = await uploadFile(one.url, jsonl);
    const run = await createRun(one.url, {
      model: CACHE_SIM.model,
      input: { file_id: fileId },
      regenerate: 'all_assistant',
      params: PLAIN,
      // Two variants that change no prompt: each reads its own cache rate.
      variants: [
        { name: 'cool', weight: 1, params: { temperature: 0.3 } },
        { name: 'warm', weight: 1, params: { temperature: 0.9 } },
      ],
      quality: false,
      shard_size: 60,
    });
    const done = await waitForStatus(one.url, run.id, ['completed', 'failed', 'paused', 'cancelled'], 240_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: n, completed: n, failed: 0 });
    const lines = await readConversations(done.output_uri, conversations);
    const share = cacheShare(lines);
    console.log(`affinity, one process: ${JSON.stringify(share)}`);
    expect(share.share).toBeGreaterThanOrEqual(0.95);
    // Each variant's cache figures are its lines' usage, every turn's, added up from the files.
    for (const v of done.variants as any[]) {
      const own = lines.filter((l) => l.variant === v.name);
      expect(own.length).toBeGreaterThan(0);
      const prompt = own.reduce((t, l) => t + l.usage.prompt_tokens, 0);
      const cached = own.reduce((t, l) => t + l.usage.cached_tokens, 0);
      expect(v.usage).toMatchObject({ prompt_tokens: prompt, cached_tokens: cached });
      expect(cached).toBeGreaterThan(0);
      expect(v.cache_hit_rate).toBeCloseTo(cached / prompt, 3);
    }
  }, 300_000);

  it("serves each tool-call step's earlier prompt, its call message included, from the same cache, within 5% of the ideal", async () => {
    const n = 160;
    const { conversations, jsonl, requests } = makeAgenticConversations(n, 'agent');
    const fileId = await uploadFile(one.url, jsonl);
    const run = await createRun(one.url, {
      model: CACHE_SIM.model,
      input: { file_id: fileId },
      regenerate: 'all_assistant',
      params: PLAIN,
      quality: false,
      shard_size: 40,
    });
    const done = await waitForStatus(one.url, run.id, ['completed', 'failed', 'paused', 'cancelled'], 240_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: n, completed: n, failed: 0 });
    expect(done.turns.completed).toBe(requests);
    const share = cacheShare(await readConversations(done.output_uri, conversations));
    console.log(`affinity, one process, agentic: ${JSON.stringify(share)}`);
    expect(share.turns).toBe(requests);
    expect(share.share).toBeGreaterThanOrEqual(0.95);
    // A step's call message is in the cache beside its prompt: the request after it computes only the tool results.
    expect(share.afterStep.cached / share.afterStep.ideal).toBeGreaterThanOrEqual(0.99);
  }, 300_000);
});
