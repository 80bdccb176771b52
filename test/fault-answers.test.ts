import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { DuckDBInstance } from '@duckdb/node-api';
import { afterEach, describe, expect, it } from 'vitest';
import {
  type AnswerFault,
  BROKEN_MODEL,
  DEEP_LEVELS,
  brokenRequests,
  type BrokenServer,
  bufferedAndStreamed,
  GOOD_USAGE,
  IMPOSSIBLE_USAGE,
  LONE_CONTENT,
  LONE_REASONING,
  startBrokenServer,
} from './support/answer-faults.js';
import { call, spawnServer, startTestServer, tempDir, waitFor } from './support/server.js';
import { createRun, listAllSamples, registerEndpoint, waitForStatus } from './support/runner-checks.js';

// What a broken server answers with HTTP 200 must not spoil regen's counts, or pass for a failing
// connection. That it cannot run regen out of memory is fault-answers-memory.test.ts.

const ENDED = ['completed', 'failed', 'cancelled'];

async function errorCodes(base: string, runId: string): Promise<string[]> {
  return [...new Set((await listAllSamples(base, runId)).map((s) => s.error?.code ?? s.status))];
}

const brokens: BrokenServer[] = [];
async function broken(fault: AnswerFault, holdUntil?: number): Promise<BrokenServer> {
  const b = await startBrokenServer({ fault, contextLength: 32_768, holdUntil });
  brokens.push(b);
  return b;
}
afterEach(async () => {
  await Promise.all(brokens.splice(0).map((b) => b.close()));
});

describe('answers that are not answers', () => {
  let regen: Awaited<ReturnType<typeof startTestServer>>;
  afterEach(async () => {
    await regen?.cleanup();
  });

  async function start(
    fault: AnswerFault,
  ): Promise<{ base: string; server: BrokenServer; endpointId: string; unhealthySeen: () => boolean; stop: () => void }> {
    const server = await broken(fault);
    // Four tries a sample, the first wait between them 50 ms (0.5 s by default): the malformed answers are
    // the point, not the wait between them.
    regen = await startTestServer({ REGEN_MAX_SERVER_FAULTS: '4', REGEN_REQUEST_RETRY_MS: '50' });
    const base = regen.url;
    const ep = await registerEndpoint(base, server.url);
    const state = async () => (await call(base, `/v1/endpoints/${ep.id}`)).body.state as string;
    await waitFor('the endpoint ready', async () => ((await state()) === 'ready' ? true : undefined));
    // Watched throughout: an endpoint made unhealthy comes back at its next probe.
    let seen = false;
    let watching = true;
    void (async () => {
      while (watching) {
        if ((await state()) === 'unhealthy') seen = true;
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    return { base, server, endpointId: ep.id, unhealthySeen: () => seen, stop: () => (watching = false) };
  }

  for (const fault of ['html', 'cut-json'] as const) {
    it(`a 200 with ${fault === 'html' ? 'an HTML page' : 'cut-off JSON'}, buffered or streamed, is malformed_response and leaves the endpoint healthy`, async () => {
      const { base, unhealthySeen, stop } = await start(fault);
      const runs = await bufferedAndStreamed(base, 3);
      for (const id of Object.values(runs)) await waitForStatus(base, id, ENDED);
      stop();
      for (const id of Object.values(runs)) expect(await errorCodes(base, id)).toEqual(['malformed_response']);
      expect(unhealthySeen()).toBe(false);
    });
  }

  it('absurd token counts are malformed_response and leave usage, the manifest and /metrics finite', async () => {
    const { base, server, stop } = await start('bad-usage');
    const runs = await bufferedAndStreamed(base, 3);
    const ended = [];
    for (const id of Object.values(runs)) ended.push(await waitForStatus(base, id, ENDED));
    const zero = { prompt_tokens: 0, completion_tokens: 0, reasoning_tokens: 0 };
    for (const run of ended) {
      expect(await errorCodes(base, run.id)).toEqual(['malformed_response']);
      expect(run.usage).toEqual(zero);
      const manifest = JSON.parse(readFileSync(fileURLToPath(new URL('manifest.json', run.output_uri)), 'utf8'));
      expect(manifest.usage).toEqual(zero);
    }
    // Proper answers afterwards are counted from zero: nothing absurd was added before them.
    server.fault = 'none';
    const good = await createRun(base, { model: BROKEN_MODEL, input: { requests: brokenRequests(2, 'g') }, quality: false });
    const done = await waitForStatus(base, good.id, ENDED);
    stop();
    expect(done.usage).toEqual({ prompt_tokens: 2 * GOOD_USAGE.prompt_tokens, completion_tokens: 2 * GOOD_USAGE.completion_tokens, reasoning_tokens: 0 });
    const metrics = (await call(base, '/metrics')).body as string;
    const tokens = /^regen_completion_tokens_total\{[^}]*\} (\S+)$/m.exec(metrics)?.[1];
    expect(tokens).toBe(String(2 * GOOD_USAGE.completion_tokens));
  });

  it('a stream framed with CRLF, comments, a field without a colon and multi-line data is read as the spec reads it', async () => {
    const { base, server, unhealthySeen, stop } = await start('crlf');
    const run = await createRun(base, { model: BROKEN_MODEL, input: { requests: brokenRequests(3, 's') }, quality: { stop_loops: true } });
    const done = await waitForStatus(base, run.id, ENDED);
    stop();
    expect(server.streamed).toBe(3);
    expect(done.status).toBe('completed');
    expect(await errorCodes(base, run.id)).toEqual(['completed']);
    const lines = readFileSync(fileURLToPath(new URL('shard-00000.jsonl', done.output_uri)), 'utf8')
      .trim()
      .split('\n');
    expect(lines.map((l) => JSON.parse(l).content)).toEqual(['The answer.', 'The answer.', 'The answer.']);
    expect(done.usage).toEqual({ prompt_tokens: 3 * GOOD_USAGE.prompt_tokens, completion_tokens: 3 * GOOD_USAGE.completion_tokens, reasoning_tokens: 0 });
    expect(unhealthySeen()).toBe(false);
  });

  it('a usage that breaks its own sums keeps its answer, the impossible part clamped and counted: no hit rate above 1 anywhere', async () => {
    const { base, endpointId, stop } = await start('impossible-usage');
    const runs = await bufferedAndStreamed(base, 3);
    const ended = [];
    for (const id of Object.values(runs)) ended.push(await waitForStatus(base, id, ENDED));
    stop();
    const { prompt_tokens: prompt, completion_tokens: completion } = IMPOSSIBLE_USAGE;
    for (const run of ended) {
      expect(run.status).toBe('completed');
      // Reasoning is part of the completion: clamped to it, never past it, in the run and its manifest.
      const usage = { prompt_tokens: 3 * prompt, completion_tokens: 3 * completion, reasoning_tokens: 3 * completion };
      expect(run.usage).toEqual(usage);
      const manifest = JSON.parse(readFileSync(fileURLToPath(new URL('manifest.json', run.output_uri)), 'utf8'));
      expect(manifest.usage).toEqual(usage);
      // Cached tokens are part of the prompt: all of it at most.
      expect(run.cache_hit_rate).toBe(1);
      expect(run.cache_by_endpoint.map((e: { cache_hit_rate: number }) => e.cache_hit_rate)).toEqual([1]);
    }
    const endpoint = (await call(base, `/v1/endpoints/${endpointId}`)).body;
    expect(endpoint.stats.cache_hit_rate).toBe(1);
    const metrics = (await call(base, '/metrics')).body as string;
    const counter = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(metrics)?.[1]);
    expect(counter(`regen_endpoint_cached_tokens_total\\{endpoint_id="${endpointId}"\\}`)).toBe(6 * prompt);
    expect(counter(`regen_endpoint_prompt_tokens_total\\{endpoint_id="${endpointId}"\\}`)).toBe(6 * prompt);
    expect(counter('regen_answer_repairs_total\\{repair="cached_tokens_clamped"\\}')).toBe(6);
    expect(counter('regen_answer_repairs_total\\{repair="reasoning_tokens_clamped"\\}')).toBe(6);
  });

  it('unpaired surrogates in an answer, buffered or streamed, are U+FFFD in JSONL and Parquet alike, and counted', async () => {
    const { base, stop } = await start('lone-surrogates');
    const formats = ['jsonl', 'parquet'] as const;
    const runs: { format: (typeof formats)[number]; id: string }[] = [];
    for (const format of formats) {
      for (const quality of [false, { stop_loops: true }]) {
        const body = { model: BROKEN_MODEL, input: { requests: brokenRequests(2, 'x') }, quality, output: { format } };
        runs.push({ format, id: (await createRun(base, body)).id });
      }
    }
    const content = LONE_CONTENT.replace(/[\ud800-\udfff]/, '\ufffd');
    const reasoning = LONE_REASONING.replace(/[\ud800-\udfff]/, '\ufffd');
    const duck = await (await DuckDBInstance.create(':memory:')).connect();
    for (const { format, id } of runs) {
      const run = await waitForStatus(base, id, ENDED);
      expect(run.status).toBe('completed');
      const path = fileURLToPath(new URL(`shard-00000.${format}`, run.output_uri));
      if (format === 'jsonl') {
        const bytes = readFileSync(path);
        // A strict reader's view: valid UTF-8, no escape of a surrogate left to decode alone.
        const text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
        expect(text).not.toMatch(/\\u[dD][89a-fA-F]/);
        const lines = text
          .trim()
          .split('\n')
          .map((l) => JSON.parse(l));
        expect(lines.map((l) => [l.content, l.reasoning_content])).toEqual([
          [content, reasoning],
          [content, reasoning],
        ]);
      } else {
        const rows = (await duck.runAndReadAll(`select content, reasoning_content from read_parquet('${path}') order by custom_id`)).getRowObjectsJson();
        expect(rows).toEqual([
          { content, reasoning_content: reasoning },
          { content, reasoning_content: reasoning },
        ]);
      }
    }
    stop();
    const metrics = (await call(base, '/metrics')).body as string;
    expect(/^regen_answer_repairs_total\{repair="lone_surrogates_replaced"\} (\S+)$/m.exec(metrics)?.[1]).toBe(String(runs.length * 2));
  });

  it(`an answer nested ${DEEP_LEVELS.toLocaleString('en')} levels deep, buffered or streamed, is malformed_response, the server's fault`, async () => {
    const { base, unhealthySeen, stop } = await start('deep');
    const runs = await bufferedAndStreamed(base, 2);
    for (const id of Object.values(runs)) await waitForStatus(base, id, ENDED);
    stop();
    for (const id of Object.values(runs)) {
      const samples = await listAllSamples(base, id);
      expect(samples.map((s) => s.error?.code)).toEqual(['malformed_response', 'malformed_response']);
      expect(samples[0].error.message).toContain('nested deeper than 100 levels');
      // Asked again under the server's fault budget, none charged to the sample's own attempts.
      for (const s of samples) expect(s.server_faults).toBeGreaterThan(0);
    }
    expect(unhealthySeen()).toBe(false);
  });

  it('an endless stream under a small answer buffer: the third cut of a sample fails it answer_too_large, said in status_reason, the log and /metrics', {
    timeout: 240_000,
  }, async () => {
    // Without max_tokens an answer may hold what the context allows (32,768 tokens × 128 B, 4 MiB):
    // an endless one passes the 1 MiB buffer long before its own bound, alone or not, and is cut
    // as the largest answer in flight every time it is asked.
    const server = await broken('endless', 4);
    const data = tempDir('regen-fault-sheds-');
    const proc = await spawnServer(data.dir, {
      REGEN_ANSWER_BUFFER_BYTES: String(1 << 20),
      REGEN_ADAPTIVE_CONCURRENCY: 'false',
      REGEN_MAX_SERVER_FAULTS: '2',
      REGEN_REQUEST_RETRY_MS: '50',
    });
    try {
      const base = proc.url;
      const ep = await registerEndpoint(base, server.url, { max_concurrency: 4 });
      await waitFor('the endpoint ready', async () => ((await call(base, `/v1/endpoints/${ep.id}`)).body.state === 'ready' ? true : undefined));
      const ids = Object.values(await bufferedAndStreamed(base, 2));
      const reasons = new Set<string>();
      const ended = await waitFor(
        'both runs to end',
        async () => {
          const runs = await Promise.all(ids.map(async (id) => (await call(base, `/v1/runs/${id}`)).body));
          for (const r of runs) if (r.status_reason) reasons.add(r.status_reason);
          return runs.every((r) => ENDED.includes(r.status)) ? runs : undefined;
        },
        120_000,
        50,
      );
      expect(ended).toHaveLength(2);
      const samples = (await Promise.all(ids.map((id) => listAllSamples(base, id)))).flat();
      expect(samples.map((s) => s.error?.code)).toEqual(Array(4).fill('answer_too_large'));
      for (const m of samples.map((s) => s.error.message as string)) expect(m).toMatch(/outgrew REGEN_ANSWER_BUFFER_BYTES \(1048576 bytes.*cut 3 times/);
      // Bounded: each sample asked three times, no more.
      expect(server.completions).toBe(4 * 3);
      expect([...reasons].some((r) => r.startsWith('answers cut at REGEN_ANSWER_BUFFER_BYTES:'))).toBe(true);
      const metrics = (await call(base, '/metrics')).body as string;
      const failed = Number(/^regen_answers_shed_total\{outcome="failed"\} (\S+)$/m.exec(metrics)?.[1]);
      expect(failed).toBe(4);
      expect(proc.output()).toContain('an answer cut 3 times to keep REGEN_ANSWER_BUFFER_BYTES');
    } finally {
      await proc.kill('SIGKILL');
      data.cleanup();
    }
  });

  it('a run, a variant or a line whose one answer can never fit REGEN_ANSWER_BUFFER_BYTES is refused before dispatch', async () => {
    regen = await startTestServer({ REGEN_ANSWER_BUFFER_BYTES: String(1 << 20) });
    const base = regen.url;
    const requests = brokenRequests(1, 'r');
    // 2 choices × 7,000 tokens × 128 B is past 1 MiB; one choice is not.
    const run = await call(base, '/v1/runs', { method: 'POST', json: { model: BROKEN_MODEL, input: { requests }, params: { n: 2, max_tokens: 7000 } } });
    expect(run.status).toBe(422);
    expect(run.body.field).toBe('params.max_tokens');
    expect(run.body.detail).toMatch(/more than REGEN_ANSWER_BUFFER_BYTES \(1048576\)/);
    const variants = [
      { name: 'short', weight: 1, params: { max_tokens: 100 } },
      { name: 'long', weight: 1, params: { max_completion_tokens: 9000 } },
    ];
    const variant = await call(base, '/v1/runs', { method: 'POST', json: { model: BROKEN_MODEL, input: { requests }, variants } });
    expect(variant.status).toBe(422);
    expect(variant.body.field).toBe('variants[1].params.max_completion_tokens');
    expect(variant.body.detail).toContain('REGEN_ANSWER_BUFFER_BYTES');
    // A line's own params over the run's: an invalid line, the others run.
    const lines = [...requests, { custom_id: 'huge', messages: [{ role: 'user', content: 'q' }], params: { max_tokens: 9000 } }];
    const created = await createRun(base, { model: BROKEN_MODEL, input: { requests: lines }, params: { max_tokens: 100 }, on_invalid_line: 'skip' });
    const validated = await waitForStatus(base, created.id, ['queued', 'in_progress', 'failed']);
    expect(validated.request_counts.total).toBe(1);
    expect(validated.invalid_lines.errors).toEqual([
      { line: 2, custom_id: 'huge', message: expect.stringMatching(/^body\.max_tokens: .*more than REGEN_ANSWER_BUFFER_BYTES/) },
    ]);
  });
});
