import { connect } from 'node:net';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { KvRank, type KvClock, type KvSettings } from '../src/sim/kv.js';
import type { Job } from '../src/sim/rank.js';
import { startSimulator, type Simulator } from '../src/sim/server.js';

const user = (content: string) => [{ role: 'user', content }];

const opened: Simulator[] = [];
afterEach(async () => {
  await Promise.all(opened.splice(0).map((sim) => sim.close()));
});

async function start(options: Parameters<typeof startSimulator>[0]): Promise<Simulator> {
  const sim = await startSimulator(options);
  opened.push(sim);
  return sim;
}

async function chat(url: string, body: object): Promise<any> {
  const response = await fetch(`${url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify(body) });
  expect(response.status).toBe(200);
  return response.json();
}

describe('simulator: SGLang routes', () => {
  it('takes healthMs to answer /health and answers 503 while draining', async () => {
    const sim = await start({ healthMs: 300, ttftMs: 500 });
    const startedAt = Date.now();
    expect((await fetch(`${sim.url}/health`)).status).toBe(200);
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(290);
    const running = fetch(`${sim.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify({ messages: user('a') }) });
    // Drained only once the request runs: a drain with nothing in flight closes at once.
    await vi.waitFor(() => expect(sim.stats().running).toBe(1), { timeout: 30_000, interval: 10 });
    const drained = sim.drain();
    expect((await fetch(`${sim.url}/health`)).status).toBe(503);
    expect((await running).status).toBe(200);
    await drained;
    await expect(fetch(`${sim.url}/health`)).rejects.toThrow();
  });

  it('closes an idle keep-alive socket after keepAliveMs', async () => {
    const sim = await start({ keepAliveMs: 5000 });
    const socket = connect(sim.port, '127.0.0.1');
    const closed = new Promise<number>((resolve) => socket.on('close', () => resolve(Date.now())));
    socket.write('GET /health HTTP/1.1\r\nHost: sim\r\n\r\n');
    const answeredAt = await new Promise<number>((resolve) => socket.once('data', () => resolve(Date.now())));
    const idle = (await closed) - answeredAt;
    expect(idle).toBeGreaterThanOrEqual(4900);
    expect(idle).toBeLessThan(7000);
  }, 10_000);

  it('reports per-rank capacity and load with data parallelism', async () => {
    const sim = await start({ maxRunning: 5, dpSize: 2, kvTokens: 1000, maxRunningRequests: 5, contextLength: 4096 });
    const info = await (await fetch(`${sim.url}/server_info`)).json();
    expect(info).toMatchObject({ max_running_requests: 5, context_length: 4096, dp_size: 2, max_total_num_tokens: 1000 });
    expect(info.internal_states.map((s: { effective_max_running_requests_per_dp: number }) => s.effective_max_running_requests_per_dp)).toEqual([3, 2]);
    const loads = await (await fetch(`${sim.url}/v1/loads?include=core`)).json();
    expect(loads).toEqual({
      timestamp: expect.any(String),
      version: '0.5.17',
      dp_rank_count: 2,
      loads: [0, 1].map((rank) => ({
        dp_rank: rank,
        num_running_reqs: 0,
        num_waiting_reqs: 0,
        num_used_tokens: 0,
        max_total_num_tokens: 1000,
        token_usage: 0,
        gen_throughput: 0,
        cache_hit_rate: 0,
        utilization: 0,
        max_running_requests: rank === 0 ? 3 : 2,
        num_total_reqs: 0,
      })),
      aggregate: { total_running_reqs: 0, total_waiting_reqs: 0, total_reqs: 0, avg_token_usage: 0, avg_throughput: 0, avg_utilization: 0 },
    });
    const metrics = await (await fetch(`${sim.url}/metrics`)).text();
    expect(metrics).toContain('sglang:num_running_reqs{model_name="sim-model",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="1"} 0');
  });

  it('answers /metrics 404 without enableMetrics', async () => {
    const sim = await start({ enableMetrics: 0 });
    const response = await fetch(`${sim.url}/metrics`);
    expect(response.status).toBe(404);
    expect(await response.json()).toEqual({ detail: 'Not Found' });
  });
});

describe('simulator: replies', () => {
  it('answers finish_reason "abort" with HTTP 200, the text so far and real usage', async () => {
    const sim = await start({ abortRate: 1 });
    const replies = await Promise.all(Array.from({ length: 20 }, (_, i) => chat(sim.url, { messages: user(`abort ${i}`) })));
    for (const reply of replies) {
      expect(reply.choices[0]).toMatchObject({ finish_reason: 'abort', matched_stop: null });
      expect(typeof reply.choices[0].message.content).toBe('string');
      expect(reply.usage.completion_tokens).toBeLessThan(96);
    }
    expect(replies.some((r) => r.usage.completion_tokens === 0)).toBe(true);
    expect(sim.stats()).toMatchObject({ aborts: 20, completed: 0 });
  });

  it('keeps the think block in content without a reasoning parser', async () => {
    const sim = await start({ reasoningParser: 0, reasoningTokens: 5, completionTokens: 5 });
    const reply = await chat(sim.url, { messages: user('no parser') });
    expect(reply.choices[0].message.reasoning_content).toBeNull();
    expect(reply.choices[0].message.content).toMatch(/^<think>\nReasoning about [0-9a-f]{4}\n<\/think>\n\nAnswer /);
    expect(reply.usage.reasoning_tokens).toBe(0);
    const off = await chat(sim.url, { messages: user('no parser'), chat_template_kwargs: { enable_thinking: false } });
    expect(off.choices[0].message.content).toMatch(/^Answer /);
  });

  it('takes the answer length from "[len=N]" in the last user message', async () => {
    const sim = await start({});
    const reply = await chat(sim.url, { messages: user('short please [len=7]'), chat_template_kwargs: { enable_thinking: false } });
    expect(reply.usage.completion_tokens).toBe(7);
  });
});

interface Workload {
  settings: KvSettings;
  /** The rank's running limit. */
  limit: number;
  /** The i-th request sent. */
  request: (i: number) => Pick<Job, 'promptTokens' | 'completionTokens' | 'maxNewTokens'>;
}

// Half short answers, half long ones: what makes an optimistic admission overshoot.
const MIXED: Workload = {
  settings: { kvTokens: 100_000, tokensPerSecond: 50, prefillTokensPerSecond: 20_000, retractStallMs: 0 },
  limit: 1000,
  request: (i) => ({ promptTokens: 1000, completionTokens: (i * 7919) % 100 < 50 ? 6000 : 200, maxNewTokens: 8192 }),
};

/**
 * Drives a KV rank in virtual time: `cap` clients, each sending again as soon as it is answered.
 * `tokenUsage` is the mean of what /v1/loads would report, sampled at every tick after the first quarter.
 */
function sweep(cap: number, durationMs: number, workload: Workload = MIXED): { completed: number; retractions: number; tokenUsage: number } {
  let now = 0;
  const timers: { at: number; fn: () => void }[] = [];
  const clock: KvClock = {
    now: () => now,
    after: (ms, fn) => {
      const timer = { at: now + ms, fn };
      timers.push(timer);
      return () => timers.splice(timers.indexOf(timer), 1);
    },
  };
  const rank = new KvRank(
    workload.settings,
    () => workload.limit,
    () => {},
    clock,
  );
  let completed = 0;
  let sent = 0;
  let usage = 0;
  let samples = 0;
  const send = (): void => {
    const job: Job = {
      ...workload.request(sent++),
      start() {},
      finish() {
        completed++;
        send();
      },
    };
    rank.enter(job);
  };
  for (let i = 0; i < cap; i++) send();
  while (now < durationMs && timers.length > 0) {
    timers.sort((a, b) => a.at - b.at);
    const next = timers.shift()!;
    now = next.at;
    next.fn();
    if (now >= durationMs / 4) {
      usage += rank.usedTokens / workload.settings.kvTokens;
      samples++;
    }
  }
  return { completed, retractions: rank.retractions, tokenUsage: usage / Math.max(1, samples) };
}

describe('simulator: KV budget', () => {
  it('queues requests past the KV pool and counts retractions', async () => {
    const sim = await start({ maxRunning: 64, kvTokens: 400, tokensPerSecond: 200, completionTokens: 50, reasoningTokens: 0 });
    const messages = (i: number) => user(`${'k'.repeat(400)} ${i}`);
    const pending = Array.from({ length: 6 }, (_, i) => chat(sim.url, { messages: messages(i), max_tokens: 100 }));
    await new Promise((resolve) => setTimeout(resolve, 50));
    const loads = await (await fetch(`${sim.url}/v1/loads`)).json();
    // 105 prompt tokens + 70 % of 100 reserved: two fit in 400 tokens, the rest wait.
    expect(loads.loads[0]).toMatchObject({ num_running_reqs: 2, num_waiting_reqs: 4 });
    expect(loads.loads[0].token_usage).toBeGreaterThan(0.5);
    await Promise.all(pending);
    expect(sim.stats()).toMatchObject({ completed: 6, running: 0, queued: 0 });
    expect(sim.stats().maxKvUsed).toBeLessThanOrEqual(400);
  });

  it('retracts once an optimistic admission outgrows the pool; too few clients starve the rank', () => {
    const results = [10, 40, 400].map((cap) => sweep(cap, 300_000));
    expect(results[0].retractions).toBe(0);
    expect(results[1].completed).toBeGreaterThan(results[0].completed * 2);
    expect(results[1].retractions).toBeGreaterThan(0);
    expect(results[2].retractions).toBeGreaterThan(0);
  });

  // 60,000 tokens of KV; a request holds 500 prompt tokens plus up to 400 answer tokens, about
  // 650 on average: some 92 fit. The advertised running limit is 512.
  const thrashing = (kvAdmission: 'optimistic' | 'none'): Workload => ({
    settings: { kvTokens: 60_000, kvAdmission, tokensPerSecond: 50, prefillTokensPerSecond: 0, retractStallMs: 0 },
    limit: 512,
    request: (i) => ({ promptTokens: 500, completionTokens: 200 + ((i * 7919) % 201), maxNewTokens: 1024 }),
  });

  it('without KV admission, a client cap past the pool thrashes: the best cap is where the pool fills', () => {
    const [starved, knee, past, limit] = [8, 96, 192, 512].map((cap) => sweep(cap, 120_000, thrashing('none')));
    expect(knee.completed).toBeGreaterThan(starved.completed * 5);
    expect(knee.completed).toBeGreaterThan(past.completed * 1.3);
    expect(past.completed).toBeGreaterThan(limit.completed * 1.3);
    expect(knee.completed).toBeGreaterThan(limit.completed * 3);
    expect(knee.tokenUsage).toBeGreaterThan(0.9);
    expect(starved.retractions).toBe(0);
    // Past the pool every step retracts, but mostly the same victims, re-admitted with nothing
    // generated: SGLang counts a retracted request once until it runs again, so the count says
    // the server retracts, and the throughput above says how much it costs.
    for (const over of [knee, past, limit]) expect(over.retractions).toBeGreaterThan(0);
    // SGLang's own admission keeps the cap-512 client at the knee's throughput: the queue just grows.
    expect(sweep(512, 120_000, thrashing('optimistic')).completed).toBeGreaterThan(knee.completed * 0.85);
  });

  it('shows the thrashing in /v1/loads, /sim/stats and /metrics', async () => {
    // About 105 prompt tokens and 40 answer tokens each: some 14 fit in 2,000 tokens, 48 are sent.
    const sim = await start({
      maxRunning: 64,
      kvTokens: 2000,
      kvAdmission: 'none',
      tokensPerSecond: 400,
      completionTokens: 40,
      reasoningTokens: 0,
    });
    const messages = (i: number) => user(`${'t'.repeat(400)} ${i}`);
    const pending = Array.from({ length: 48 }, (_, i) => chat(sim.url, { messages: messages(i), max_tokens: 100 }));
    // Read while the 48 are still there: on a loaded machine they may take longer than any fixed
    // wait to arrive (a 60 ms sleep once read the pool a quarter full), and the thrashing lasts
    // until the queue is gone. No reading may show the pool past full.
    const usages: number[] = [];
    await vi.waitFor(
      async () => {
        const loads = await (await fetch(`${sim.url}/v1/loads`)).json();
        usages.push(loads.loads[0].token_usage);
        expect(loads.loads[0].token_usage).toBeGreaterThan(0.9);
        expect(loads.loads[0].num_waiting_reqs).toBeGreaterThan(0);
        const metrics = await (await fetch(`${sim.url}/metrics`)).text();
        expect(Number(/^sglang:num_retracted_reqs\{[^}]*\} (\S+)$/m.exec(metrics)?.[1])).toBeGreaterThan(0);
        expect(Number(/^sglang:num_retracted_requests_total\{[^}]*\} (\S+)$/m.exec(metrics)?.[1])).toBeGreaterThan(0);
      },
      { timeout: 30_000, interval: 10 },
    );
    expect(Math.max(...usages)).toBeLessThanOrEqual(1);
    const replies = await Promise.all(pending);
    expect(replies.every((reply) => reply.usage.completion_tokens === 40)).toBe(true);
    const stats = await (await fetch(`${sim.url}/sim/stats`)).json();
    expect(stats).toMatchObject({ completed: 48, running: 0, queued: 0 });
    expect(stats.retracted).toBeGreaterThan(0);
    // The batch asked for more than the pool holds: that is what the thrashing costs.
    expect(stats.maxKvUsed).toBeGreaterThan(2000);
    await expect(startSimulator({ kvAdmission: 'never' as never })).rejects.toThrow('kvAdmission must be "optimistic" or "none"');
  });
});
