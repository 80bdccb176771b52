import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FLAGS } from '../src/domain/flags.js';
import { gateVerdict } from '../src/domain/quality.js';
import { loadSource } from './support/build.js';
import type { RunRow } from '../src/db/schema.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, startTestServer, waitFor } from './support/server.js';
import { onPg } from './support/store.js';
import { createRun, getRun, listAllSamples, registerEndpoint, waitForStatus } from './support/runner-checks.js';

// As the server under test has it: its store is the compiled tree's (test/support/build.ts).
const { sqliteClient } = await loadSource<typeof import('../src/db/client.js')>('src/db/client.ts');

// One simulator per behaviour, each serving its own model so every run reaches only its own.
const BROKEN = 'broken-sim';
const HEALTHY = 'healthy-sim';
const THINKER = 'thinker-sim';
const THINKING = { chat_template_kwargs: { enable_thinking: true } };

let server: Awaited<ReturnType<typeof startTestServer>>;
let broken: SimProcess;
const sims: SimProcess[] = [];
const stores = new Stores({ forcePathStyle: false });

beforeAll(async () => {
  // 87% of replies are the story's failure: an empty think block and "OK.".
  broken = await spawnSimulator({ model: BROKEN, 'degenerate-rate': 0.87, 'max-running': 16, 'ttft-ms': 20, seed: 5 });
  sims.push(broken);
  sims.push(await spawnSimulator({ model: HEALTHY, 'max-running': 64, seed: 6 }));
  // Thinks for 200 tokens, more than the runs below allow: the answer never starts.
  sims.push(await spawnSimulator({ model: THINKER, 'reasoning-tokens': 200, 'max-running': 32, seed: 7 }));
  server = await startTestServer();
  for (const s of sims) await registerEndpoint(server.url, s.url);
});

afterAll(async () => {
  await server?.cleanup();
  stores.close();
  await Promise.all(sims.map((s) => s.stop()));
});

const requests = (n: number, tag: string) =>
  Array.from({ length: n }, (_, i) => ({ custom_id: `${tag}-${i}`, messages: [{ role: 'user', content: `${tag} question ${i}: what is ${i} + ${i}?` }] }));

/** Flag → number of completed samples carrying it, recounted from the samples themselves. */
function tally(flagLists: string[][]): { flagged: number; by_flag: Record<string, number> } {
  const by_flag = Object.fromEntries(FLAGS.map((f) => [f, 0]));
  for (const flags of flagLists) for (const f of flags) by_flag[f]++;
  return { flagged: flagLists.filter((f) => f.length > 0).length, by_flag };
}

async function quality(id: string): Promise<any> {
  const res = await call(server.url, `/v1/runs/${id}/quality`);
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

async function listFlagged(id: string, flag: string): Promise<any[]> {
  const all: any[] = [];
  let after = '';
  for (;;) {
    const res = await call(server.url, `/v1/runs/${id}/samples?flag=${flag}&limit=100${after ? `&after=${after}` : ''}`);
    expect(res.status).toBe(200);
    all.push(...res.body.data);
    if (!res.body.has_more) return all;
    after = encodeURIComponent(res.body.last_id);
  }
}

/** Every output line of a finished run, read from its shards through the manifest. */
async function readOutput(run: any): Promise<{ manifest: any; lines: any[] }> {
  const store = stores.forUri(run.output_uri);
  const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
  const lines: any[] = [];
  for (const shard of manifest.shards) {
    const text = (await store.get(shard.key)).toString('utf8');
    if (text)
      lines.push(
        ...text
          .trimEnd()
          .split('\n')
          .map((l) => JSON.parse(l)),
      );
  }
  return { manifest, lines };
}

/** The counters the run reports must equal a recount of its samples, and the flag listing must agree. */
async function expectExactFlags(run: any): Promise<any[]> {
  const all = await listAllSamples(server.url, run.id);
  const completed = all.filter((s) => s.status === 'completed');
  expect(all.filter((s) => s.status !== 'completed' && s.flags.length > 0)).toEqual([]);
  expect(run.quality).toEqual(tally(completed.map((s) => s.flags)));
  for (const f of FLAGS) {
    const listed = await listFlagged(run.id, f);
    expect(
      listed.map((s) => s.custom_id),
      `?flag=${f}`,
    ).toEqual(completed.filter((s) => s.flags.includes(f)).map((s) => s.custom_id));
  }
  return completed;
}

const bucketOf = (h: any, value: number) => h.buckets.findIndex((b: any) => value >= b.ge && (b.lt === null || value < b.lt));
const countIn = (h: any, value: number) => h.buckets[bucketOf(h, value)].count;

describe('the quality gate on a broken endpoint', () => {
  it('pauses the run in its first few hundred samples, names the flags, and continues on override', async () => {
    const total = 1000;
    const created = await createRun(server.url, {
      model: BROKEN,
      input: { requests: requests(total, 'b') },
      params: { max_tokens: 512, ...THINKING },
      shard_size: 100,
      quality: { min_completion_tokens: 16 },
    });

    const paused = await waitForStatus(server.url, created.id, ['paused', 'completed', 'failed']);
    expect(paused.status).toBe('paused');
    const verdict = /^quality gate: (\d+)% of the last (\d+) samples flagged \(limit 20%\): ([^;]+)/.exec(paused.status_reason);
    expect(verdict, paused.status_reason).not.toBeNull();
    const judged = Number(verdict![2]);
    expect(judged).toBeGreaterThanOrEqual(200);
    // "OK." after an empty think block: missing_reasoning, too_short under this run's minimum, and
    // the same text again and again.
    expect(verdict![3]).toMatch(/missing_reasoning \d+%/);
    expect(verdict![3]).toMatch(/too_short \d+%/);
    expect(Number(verdict![1])).toBeGreaterThan(20);
    // The cause, in the operator's words.
    expect(paused.status_reason).toContain('--reasoning-parser');

    // Requests in flight at the pause still finish and are recorded; nothing new is sent.
    const settled = await waitFor('requests in flight at the pause to finish', async () => {
      const r = await getRun(server.url, created.id);
      return r.request_counts.in_progress === 0 ? r : undefined;
    });
    expect(settled.status).toBe('paused');
    expect(settled.request_counts.completed).toBeGreaterThanOrEqual(judged);
    expect(settled.request_counts.completed).toBeLessThan(600);
    expect(settled.request_counts.pending).toBeGreaterThan(0);

    const completed = await expectExactFlags(settled);
    expect(settled.quality.by_flag.missing_reasoning).toBeGreaterThan(0);
    expect(settled.quality.by_flag.empty_content).toBe(0);
    // A flagged answer was asked again once (retry_flagged 1) and the last attempt's flags kept.
    const flaggedSamples = completed.filter((s) => s.flags.length > 0);
    expect(flaggedSamples.every((s) => s.attempts === 2)).toBe(true);
    expect(completed.filter((s) => s.flags.length === 0).every((s) => s.attempts <= 2)).toBe(true);

    const q = await quality(created.id);
    expect(q).toMatchObject({
      object: 'run.quality',
      run_id: created.id,
      status: 'paused',
      completed: settled.request_counts.completed,
      flagged: settled.quality.flagged,
      settings: { min_completion_tokens: 16, retry_flagged: 1, gate: { min_samples: 200, max_flag_rate: 0.2 }, stop_loops: true },
      thinking_requested: true,
      gate: { enabled: true, overridden: false, tripped: true, over_limit: true, status_reason: paused.status_reason },
    });
    for (const f of FLAGS) {
      const n = settled.quality.by_flag[f];
      expect(q.by_flag[f].count).toBe(n);
      expect(q.by_flag[f].share).toBeCloseTo(n / q.completed, 3);
      expect(q.by_flag[f].examples).toEqual(
        completed
          .filter((s) => s.flags.includes(f))
          .slice(0, 5)
          .map((s) => s.custom_id),
      );
    }
    expect(q.by_flag.missing_reasoning.examples).toHaveLength(5);
    // The histograms agree with the samples: every degenerate answer has an empty think block
    // and a 3-character content, a healthy one 64 content tokens (256 characters).
    const h = q.histograms;
    for (const name of ['completion_tokens', 'reasoning_chars', 'content_chars']) {
      expect(h[name].samples).toBe(q.completed);
      expect(h[name].buckets.reduce((t: number, b: any) => t + b.count, 0)).toBe(q.completed);
    }
    const degenerate = settled.quality.by_flag.missing_reasoning;
    expect(countIn(h.reasoning_chars, 0)).toBe(degenerate);
    expect(countIn(h.content_chars, 3)).toBe(degenerate);
    expect(countIn(h.content_chars, 256)).toBe(q.completed - degenerate);
    const tokenHist = new Map<number, number>();
    for (const s of completed)
      tokenHist.set(
        bucketOf(h.completion_tokens, s.usage.completion_tokens),
        (tokenHist.get(bucketOf(h.completion_tokens, s.usage.completion_tokens)) ?? 0) + 1,
      );
    for (const [i, b] of (h.completion_tokens.buckets as any[]).entries()) expect(b.count, `completion_tokens bucket ${b.ge}`).toBe(tokenHist.get(i) ?? 0);

    // Resuming without the override would only trip again; with it the run finishes.
    const resumed = await call(server.url, `/v1/runs/${created.id}/resume`, { method: 'POST', json: { override_gate: true } });
    expect(resumed.status).toBe(200);
    expect(resumed.body.status_reason).toBeNull();
    const done = await waitForStatus(server.url, created.id, ['completed', 'paused', 'failed']);
    expect(done.status).toBe('completed');
    expect(done.request_counts.completed).toBe(total);
    const finalCompleted = await expectExactFlags(done);
    expect(done.quality.flagged / total).toBeGreaterThan(0.2);
    const after = await quality(created.id);
    expect(after.gate).toEqual({ enabled: true, overridden: true, tripped: false, over_limit: true, status_reason: null });

    // Output lines carry each sample's flags; the manifest carries the summary.
    const out = await readOutput(done);
    expect(out.lines).toHaveLength(total);
    expect(tally(out.lines.map((l) => l.flags))).toEqual(done.quality);
    const byId = new Map(finalCompleted.map((s) => [s.custom_id, s]));
    for (const l of out.lines) expect(l.flags, l.custom_id).toEqual(byId.get(l.custom_id).flags);
    // SGLang sends reasoning_content null when the think block is empty.
    expect(out.lines.filter((l) => l.flags.includes('missing_reasoning')).every((l) => l.reasoning_content === null && l.content === 'OK.')).toBe(true);
    expect(out.manifest.quality).toEqual({ ...done.quality, settings: q.settings });

    // The endpoint is fixed; asking the flagged samples again leaves no flag anywhere.
    await broken.configure({ degenerateRate: 0 });
    const retried = await call(server.url, `/v1/runs/${created.id}/retry`, { method: 'POST', json: { only: 'flagged' } });
    expect(retried.status).toBe(200);
    expect(retried.body.quality.flagged).toBe(0);
    expect(retried.body.request_counts.completed).toBe(total - done.quality.flagged);
    const fixed = await waitForStatus(server.url, created.id, ['completed', 'paused', 'failed']);
    expect(fixed.status).toBe('completed');
    expect(fixed.request_counts.completed).toBe(total);
    expect(fixed.quality).toEqual(tally([]));
    await expectExactFlags(fixed);
    const rewritten = await readOutput(fixed);
    expect(rewritten.lines).toHaveLength(total);
    expect(rewritten.lines.every((l) => l.flags.length === 0 && l.reasoning_content.length > 0)).toBe(true);
    expect(rewritten.manifest.quality.flagged).toBe(0);
    const fixedQuality = await quality(created.id);
    expect(countIn(fixedQuality.histograms.reasoning_chars, 0)).toBe(0);
    expect(FLAGS.every((f) => fixedQuality.by_flag[f].count === 0 && fixedQuality.by_flag[f].examples.length === 0)).toBe(true);
  });
});

describe('a healthy endpoint', () => {
  it('flags nothing over a few thousand samples, some of which turn thinking off on their own line', async () => {
    const total = 3000;
    // A line's own params win over the run's: these ask for no thinking, so no reasoning is due.
    const noThinking = (i: number) => i % 10 === 0;
    const lines = requests(total, 'h').map((r, i) => (noThinking(i) ? { ...r, params: { chat_template_kwargs: { enable_thinking: false } } } : r));
    const created = await createRun(server.url, {
      model: HEALTHY,
      input: { requests: lines },
      params: THINKING,
      quality: { min_completion_tokens: 16 },
    });
    const done = await waitForStatus(server.url, created.id, ['completed', 'paused', 'failed']);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.quality).toEqual(tally([]));
    const completed = await expectExactFlags(done);
    expect(completed).toHaveLength(total);
    expect(completed.every((s) => s.attempts === 1)).toBe(true);

    // The simulator's defaults: 32 reasoning tokens and 64 answer tokens, 4 characters a token;
    // 64 and 96 tokens share the [64, 256) bucket.
    const q = await quality(created.id);
    expect(q.gate).toEqual({ enabled: true, overridden: false, tripped: false, over_limit: false, status_reason: null });
    const quiet = completed.filter((s) => noThinking(Number(s.custom_id.slice(2)))).length;
    expect(quiet).toBe(total / 10);
    expect(countIn(q.histograms.completion_tokens, 96)).toBe(total);
    expect(countIn(q.histograms.reasoning_chars, 0)).toBe(quiet);
    expect(countIn(q.histograms.reasoning_chars, 128)).toBe(total - quiet);
    expect(countIn(q.histograms.content_chars, 256)).toBe(total);
  });
});

describe('thinking cut by max_tokens', () => {
  const cut = { max_tokens: 100, ...THINKING };

  it('flags truncated and empty_content; a run with the gate off finishes', async () => {
    const total = 250;
    const created = await createRun(server.url, { model: THINKER, input: { requests: requests(total, 't') }, params: cut, quality: { gate: false } });
    const done = await waitForStatus(server.url, created.id, ['completed', 'paused', 'failed']);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.quality).toEqual({ flagged: total, by_flag: { ...tally([]).by_flag, empty_content: total, truncated: total } });
    await expectExactFlags(done);
    const out = await readOutput(done);
    for (const l of out.lines) {
      expect(l).toMatchObject({ finish_reason: 'length', content: '', flags: ['empty_content', 'truncated'], attempts: 2 });
      expect(l.reasoning_content).toHaveLength(400);
    }
    expect(out.manifest.quality.settings).toEqual({ min_completion_tokens: 0, retry_flagged: 1, gate: false, stop_loops: true });
    const q = await quality(created.id);
    expect(q.gate).toMatchObject({ enabled: false, tripped: false, over_limit: false });
    expect(countIn(q.histograms.content_chars, 0)).toBe(total);
  });

  it('trips the default gate on the same endpoint', async () => {
    const created = await createRun(server.url, { model: THINKER, input: { requests: requests(600, 'g') }, params: cut });
    const paused = await waitForStatus(server.url, created.id, ['paused', 'completed', 'failed']);
    expect(paused.status).toBe('paused');
    expect(paused.status_reason).toMatch(/^quality gate: 100% of the last \d+ samples flagged \(limit 20%\): empty_content 100%, truncated 100%/);
    expect((await call(server.url, `/v1/runs/${created.id}/cancel`, { method: 'POST' })).status).toBe(200);
    await waitForStatus(server.url, created.id, ['cancelled']);
  });

  it('flags nothing when quality checks are off', async () => {
    const total = 50;
    const created = await createRun(server.url, { model: THINKER, input: { requests: requests(total, 'off') }, params: cut, quality: false });
    const done = await waitForStatus(server.url, created.id, ['completed', 'paused', 'failed']);
    expect(done.status).toBe('completed');
    expect(done.quality).toEqual(tally([]));
    const completed = await expectExactFlags(done);
    expect(completed.every((s) => s.attempts === 1 && s.finish_reason === 'length')).toBe(true);
    const q = await quality(created.id);
    expect(q).toMatchObject({ settings: false, flagged: 0, gate: { enabled: false, tripped: false, over_limit: false } });
    expect((await readOutput(done)).manifest.quality.settings).toBe(false);
  });

  it('answers 404 for a run that does not exist', async () => {
    const res = await call(server.url, '/v1/runs/run_missing/quality');
    expect(res.status).toBe(404);
    expect(res.headers.get('content-type')).toContain('application/problem+json');
  });
});

// SQLite's query plans; PostgreSQL plans by statistics and has its own partial indexes (test/pg-schema.test.ts).
describe.skipIf(onPg)('the quality queries', () => {
  const plan = (sql: string, ...args: unknown[]) =>
    (
      sqliteClient(server.deps.db)
        .prepare(`explain query plan ${sql}`)
        .all(...args) as { detail: string }[]
    )
      .map((r) => r.detail)
      .join('; ');

  it('count histogram buckets as ranges of narrow indexes and walk a per-flag index for examples and ?flag=', () => {
    for (const col of ['completion_tokens', 'reasoning_chars', 'content_chars']) {
      expect(plan(`select count(*) from samples where run_id = ? and status = 'completed' and ${col} >= 64 and ${col} < 256`, 'run_x')).toMatch(
        new RegExp(`USING COVERING INDEX samples_${col}_idx \\(run_id=\\? AND ${col}>\\? AND ${col}<\\?\\)`),
      );
    }
    FLAGS.forEach((f, i) => {
      expect(plan(`select custom_id from samples where run_id = ? and (flags & ${1 << i}) <> 0 order by seq limit 5`, 'run_x')).toMatch(
        new RegExp(`USING INDEX samples_flag_${f}_idx`),
      );
      // What listSamples sends for ?flag=: the bit as a bound parameter still selects the index.
      expect(plan(`select * from samples where run_id = ? and (flags & ?) <> ? and seq > ? order by seq limit ?`, 'run_x', 1 << i, 0, 10, 101)).toMatch(
        new RegExp(`USING INDEX samples_flag_${f}_idx`),
      );
    });
  });
});

describe('gateVerdict', () => {
  const run = (over: Partial<RunRow>) =>
    ({ completed: 1000, flagged: 0, flagEmptyContent: 0, flagMissingReasoning: 0, flagTruncated: 0, flagRepetitive: 0, flagTooShort: 0, ...over }) as RunRow;

  it('lists the flags present, most frequent first, with their shares', () => {
    const r = run({ completed: 214, flagged: 186, flagEmptyContent: 184, flagMissingReasoning: 185, flagTooShort: 3 });
    expect(gateVerdict(r, { min_samples: 200, max_flag_rate: 0.2 })).toBe(
      'quality gate: missing_reasoning 86%, empty_content 86%, too_short 1% of 214 samples (flagged 87%, limit 20%)',
    );
  });

  it('says "<1%" for a rare flag rather than 0%, and keeps a fractional limit', () => {
    const r = run({ flagged: 300, flagRepetitive: 299, flagTruncated: 3 });
    expect(gateVerdict(r, { min_samples: 100, max_flag_rate: 0.125 })).toBe(
      'quality gate: repetitive 30%, truncated <1% of 1000 samples (flagged 30%, limit 12.5%)',
    );
  });
});
