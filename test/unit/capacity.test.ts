import { describe, expect, it } from 'vitest';
import { capInUse } from '../../src/domain/concurrency.js';
import { AdaptiveCap, queueBand, serverCeiling, type Load } from '../../src/runner/capacity.js';
import { runKvDispatch } from '../support/kv-dispatch.js';
import { metricSum, parseLoads, parseMetrics, parseModels, parseServerInfo } from '../../src/runner/server-info.js';

const load = (at: number, l: Partial<Load>): Load => ({ at, running: 0, waiting: 0, tokenUsage: 0, retracted: 0, ...l });

describe('AdaptiveCap', () => {
  it('starts low enough not to flood a KV pool, never above the ceiling', () => {
    expect(new AdaptiveCap(2048).cap).toBe(64);
    expect(new AdaptiveCap(20).cap).toBe(20);
    // A pool of 20,000 tokens: 64 requests sent together would fill it at once at their end.
    expect(new AdaptiveCap(2048, { maxRunning: 2048, kvTokens: 20_000 }).cap).toBe(5);
    expect(new AdaptiveCap(2048, { maxRunning: 2048, kvTokens: 1_000_000 }).cap).toBe(64);
  });

  it('grows in its first lifetime while regen fills its cap, the queue is short and the KV pool is little used', () => {
    const c = new AdaptiveCap(2048);
    c.observe(load(0, { running: 64, tokenUsage: 0.1 }), 64);
    expect(c.cap).toBe(80);
    c.observe(load(1000, { running: 80, tokenUsage: 0.2 }), 80);
    expect(c.cap).toBe(100);
    // Young requests hold a part of what they will: a quarter of the pool is as far as it goes before a lifetime is seen.
    c.observe(load(2000, { running: 100, tokenUsage: 0.3 }), 100);
    expect(c.cap).toBe(100);
  });

  it('does not grow on a server regen is not keeping full', () => {
    const c = new AdaptiveCap(2048);
    c.observe(load(0, { running: 10, tokenUsage: 0.1 }), 10);
    expect(c.cap).toBe(64);
  });

  it('once a lifetime is seen, grows only as far as the pool holds every request at the largest share one held', () => {
    const c = new AdaptiveCap(2048);
    const lifetime = 1000;
    // 64 requests whose usage peaks at 0.64 of the pool: each holds at most 1%, so 85 fit at 0.85.
    c.observe(load(0, { running: 64, tokenUsage: 0.3 }), 64, lifetime);
    for (let t = 250; t <= 20_000; t += 250) {
      // Each request's share grows from half a percent to one over the lifetime, read every 250 ms.
      const share = 0.005 + 0.005 * ((t % lifetime) / (lifetime - 250));
      c.observe(load(t, { running: c.cap, tokenUsage: c.cap * share }), c.cap, lifetime);
    }
    expect(c.cap).toBeGreaterThanOrEqual(80);
    expect(c.cap).toBeLessThanOrEqual(85);
  });

  it('near what the pool holds, grows a few at a time', () => {
    const c = new AdaptiveCap(2048);
    c.observe(load(0, { running: 64, tokenUsage: 0.3 }), 64, 1000);
    c.observe(load(1000, { running: 64, tokenUsage: 0.6 }), 64, 1000);
    // 0.85 / (0.6 / 64) = 90 fit: less than twice the cap, so one step of 5%.
    expect(c.cap).toBe(68);
  });

  it('lets a full server queue only what it holds back at two readings in a row, a few at a time', () => {
    const c = new AdaptiveCap(2048);
    c.observe(load(0, { running: 60, waiting: 1, tokenUsage: 0.95 }), 64);
    expect(c.cap).toBe(64);
    c.observe(load(1000, { running: 60, waiting: 2, tokenUsage: 0.95 }), 64);
    expect(c.cap).toBe(68);
  });

  it('fills the queue band at once on a server at its running limit', () => {
    const c = new AdaptiveCap(serverCeiling(64), { maxRunning: 64, kvTokens: null });
    c.observe(load(0, { running: 64, waiting: 0, tokenUsage: 0.01 }), 64);
    expect(c.cap).toBe(serverCeiling(64));
  });

  it('cuts back when the server retracts, holds for a lifetime, and does not go back up to that level for a minute', () => {
    const c = new AdaptiveCap(2048);
    const lifetime = 1000;
    c.observe(load(0, { running: 64, tokenUsage: 0.5, retracted: 0 }), 64, lifetime);
    c.observe(load(1000, { running: 64, tokenUsage: 0.99, retracted: 50 }), 64, lifetime);
    expect(c.cap).toBe(Math.floor(64 * 0.85));
    const cut = c.cap;
    c.observe(load(1500, { running: cut, tokenUsage: 0.3, retracted: 50 }), cut, lifetime);
    expect(c.cap).toBe(cut);
    // A pool that holds 100 of these requests at 0.85: the knee, not the pool, holds the cap.
    for (let t = 2000; t < 50_000; t += 1000) c.observe(load(t, { running: c.cap, tokenUsage: c.cap * 0.0085, retracted: 50 }), c.cap, lifetime);
    expect(c.cap).toBe(63);
    for (let t = 62_000; t < 70_000; t += 1000) c.observe(load(t, { running: c.cap, tokenUsage: c.cap * 0.0085, retracted: 50 }), c.cap, lifetime);
    expect(c.cap).toBeGreaterThan(64);
  });

  it('takes a retraction a minute as rare, as SGLang does, but does not grow on it', () => {
    const c = new AdaptiveCap(2048);
    c.observe(load(0, { running: 64, tokenUsage: 0.1, retracted: 0 }), 64);
    const before = c.cap;
    c.observe(load(1000, { running: before, tokenUsage: 0.1, retracted: 1 }), before);
    expect(c.cap).toBe(before);
  });

  it('shrinks a queue past the top of its band', () => {
    const c = new AdaptiveCap(2048);
    const { high } = queueBand(40);
    c.observe(load(0, { running: 40, waiting: high + 10, tokenUsage: 0.95 }), 64);
    expect(c.cap).toBe(54);
  });

  it('settles under the knee of a server that retracts past it', () => {
    // A toy server whose KV pool holds `knee` requests: usage grows with what runs, and more than
    // fit are retracted at once.
    const knee = 300;
    const c = new AdaptiveCap(serverCeiling(2048));
    let retracted = 0;
    const seen: number[] = [];
    for (let t = 0; t < 300_000; t += 1000) {
      const inFlight = c.cap;
      if (inFlight > knee) retracted += inFlight - knee;
      c.observe(load(t, { running: inFlight, tokenUsage: Math.min(1, inFlight / knee), retracted }), inFlight, 1000);
      if (t > 60_000) seen.push(c.cap);
    }
    const mean = seen.reduce((a, b) => a + b, 0) / seen.length;
    // The pool holds `knee` at full usage: the cap aims for 80% of it.
    expect(mean).toBeGreaterThan(0.75 * knee);
    expect(mean).toBeLessThanOrEqual(knee);
  });
});

describe("the adaptive cap on a KV-bound server (the simulator's KV rank, in virtual time)", () => {
  it('reaches 0.98 of the best fixed cap with about one retraction a minute, counted over the whole run', () => {
    // The bench's windows: a fixed cap is counted after 12 s, over 15 s.
    const fixed = [56, 64, 72, 80, 96].map((cap) => runKvDispatch({ fixedCap: cap, seed: 1, runMs: 27_000, warmMs: 12_000 }).rate);
    const best = Math.max(...fixed);
    for (const seed of [1, 2, 3, 4]) {
      // Two minutes after the warm-up, so that a retraction a minute shows as two.
      const got = runKvDispatch({ seed, runMs: 132_000, warmMs: 12_000 });
      console.log(
        `kv dispatch, seed ${seed}: fixed caps ${fixed.map((r) => r.toFixed(1)).join(', ')}; adaptive ${got.rate.toFixed(1)} at ${got.cap}, ${got.retracted} retracted`,
      );
      expect(got.rate).toBeGreaterThanOrEqual(0.98 * best);
      expect(got.retracted).toBeLessThanOrEqual(2);
    }
  });
});

describe('capInUse', () => {
  const server = { maxRunning: 256, kvTokens: 100_000 };
  it('prefers the adaptive cap, never above the operator', () => {
    expect(capInUse(null, server, 120, 32)).toEqual({ cap: 120, source: 'adaptive' });
    expect(capInUse(100, server, 120, 32)).toEqual({ cap: 100, source: 'user' });
    expect(capInUse(200, server, 120, 32)).toEqual({ cap: 120, source: 'adaptive' });
  });
  it('falls back to the operator, the server and the default', () => {
    expect(capInUse(50, server, null, 32)).toEqual({ cap: 50, source: 'user' });
    expect(capInUse(null, server, null, 32)).toEqual({ cap: 256, source: 'server' });
    expect(capInUse(null, { maxRunning: null, kvTokens: null }, null, 32)).toEqual({ cap: 32, source: 'default' });
  });
});

describe('reading what SGLang says of itself', () => {
  it('sums effective_max_running_requests_per_dp over DP ranks; the null launch flag says nothing', () => {
    const info = parseServerInfo({
      max_running_requests: null,
      max_total_num_tokens: 500_000,
      startup_time: 1733200000.5,
      internal_states: [{ effective_max_running_requests_per_dp: 2048 }, { effective_max_running_requests_per_dp: 2048 }],
    });
    expect(info).toEqual({ capacity: { maxRunning: 4096, kvTokens: 500_000 }, startupTime: 1733200000.5 });
  });

  it('uses the launch flag only when the ranks do not say (before v0.5.8)', () => {
    expect(parseServerInfo({ max_running_requests: 256 }).capacity.maxRunning).toBe(256);
    expect(parseServerInfo({ max_running_requests: null }).capacity.maxRunning).toBeNull();
    expect(parseServerInfo('not json').capacity).toEqual({ maxRunning: null, kvTokens: null });
  });

  it('reads the served name and context length from /v1/models', () => {
    expect(parseModels({ object: 'list', data: [{ id: '/models/Qwen3-27B', max_model_len: 40960 }] })).toEqual({
      model: '/models/Qwen3-27B',
      maxModelLen: 40960,
    });
    expect(parseModels({ data: [] })).toBeNull();
    expect(parseModels({ detail: 'Not Found' })).toBeNull();
  });

  it('sums /v1/loads over DP ranks', () => {
    const l = parseLoads(
      {
        loads: [
          { dp_rank: 0, num_running_reqs: 10, num_waiting_reqs: 2, num_used_tokens: 500, max_total_num_tokens: 1000 },
          { dp_rank: 1, num_running_reqs: 20, num_waiting_reqs: 3, num_used_tokens: 900, max_total_num_tokens: 1000 },
        ],
      },
      7,
    );
    expect(l).toEqual({ at: 7, running: 30, waiting: 5, tokenUsage: 0.7, retracted: null, cacheHitRate: null });
    expect(parseLoads({ loads: [] }, 7)).toBeNull();
  });

  it('reads /metrics series per DP rank, and the retraction counter', () => {
    const text = [
      '# TYPE sglang:num_running_reqs gauge',
      'sglang:num_running_reqs{model_name="m",dp_rank="0"} 10.0',
      'sglang:num_running_reqs{model_name="m",dp_rank="1"} 12.0',
      'sglang:num_queue_reqs{model_name="m",dp_rank="0"} 1.0',
      'sglang:num_queue_reqs{model_name="m",dp_rank="1"} 0.0',
      'sglang:token_usage{model_name="m",dp_rank="0"} 0.5',
      'sglang:token_usage{model_name="m",dp_rank="1"} 0.7',
      'sglang:num_retracted_reqs{model_name="m",dp_rank="0"} 0.0',
      'sglang:num_retracted_requests_total{model_name="m"} 42.0',
    ].join('\n');
    expect(parseMetrics(text, 3)).toEqual({ at: 3, running: 22, waiting: 1, tokenUsage: 0.6, retracted: 42, retractedNow: 0, cacheHitRate: null });
    expect(metricSum(text, 'sglang:gen_throughput')).toBeNull();
    expect(parseMetrics('# nothing', 3)).toBeNull();
  });

  it("takes a server's cache hit rate only from 0 to 1: a broken server's 500 is no reading", () => {
    const loads = (hits: unknown[]) =>
      parseLoads({ loads: hits.map((h) => ({ num_running_reqs: 1, num_waiting_reqs: 0, cache_hit_rate: h })) }, 1)?.cacheHitRate;
    expect(loads([0.25, 0.75])).toBe(0.5);
    expect(loads([500, 0.5])).toBe(0.5);
    expect(loads([500, -1])).toBeNull();
    const metrics = (hit: string) => parseMetrics(`sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\nsglang:cache_hit_rate ${hit}`, 1)?.cacheHitRate;
    expect(metrics('0.4')).toBe(0.4);
    expect(metrics('500')).toBeNull();
  });
});
