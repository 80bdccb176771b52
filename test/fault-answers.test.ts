import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { type AnswerFault, type BrokenServer, GOOD_USAGE, startBrokenServer } from './support/answer-faults.js';
import { peakRssMiB } from './support/faults.js';
import { call, spawnServer, startTestServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { createRun, listAllSamples, registerEndpoint, waitForStatus } from './support/runner-checks.js';

// What a broken server answers with HTTP 200 must not run regen out of memory, spoil its counts, or
// pass for a failing connection.

const MODEL = 'broken-model';
const ENDED = ['completed', 'failed', 'cancelled'];

function requests(n: number, tag: string) {
  return Array.from({ length: n }, (_, i) => ({ custom_id: `${tag}${i}`, messages: [{ role: 'user', content: `question ${i}` }] }));
}

/** Two runs on one endpoint: one read buffered (quality checks off), one streamed (loops stopped). */
async function bufferedAndStreamed(base: string, perRun: number): Promise<{ buffered: string; streamed: string }> {
  const buffered = await createRun(base, { model: MODEL, input: { requests: requests(perRun, 'b') }, quality: false });
  const streamed = await createRun(base, { model: MODEL, input: { requests: requests(perRun, 's') }, quality: { stop_loops: true } });
  return { buffered: buffered.id, streamed: streamed.id };
}

async function errorCodes(base: string, runId: string): Promise<string[]> {
  return [...new Set((await listAllSamples(base, runId)).map((s) => s.error?.code ?? s.status))];
}

const brokens: BrokenServer[] = [];
async function broken(fault: AnswerFault, contextLength = 32_768, holdUntil = 0): Promise<BrokenServer> {
  const b = await startBrokenServer({ fault, contextLength, holdUntil });
  brokens.push(b);
  return b;
}
afterEach(async () => {
  await Promise.all(brokens.splice(0).map((b) => b.close()));
});

describe('an endpoint that streams without end', () => {
  const data = tempDir('regen-fault-answers-');
  let regen: ServerProcess | null = null;
  afterAll(async () => {
    await regen?.kill('SIGKILL');
    data.cleanup();
  });

  // A context of 65,536 tokens bounds each answer at about 8 MiB (answerByteLimit): 64 of them
  // would hold twice the default budget of 256 MiB, so the budget cuts some (their samples are
  // given back and asked again) and the bound the rest.
  const CONTEXT = 65_536;
  const IN_FLIGHT = 64;
  const RSS_LIMIT_MIB = 1024;

  it('64 requests in flight, buffered and streamed: RSS stays under 1 GiB and every sample fails at its own bound', { timeout: 400_000 }, async () => {
    // Nothing is streamed until all 64 requests have arrived: they are in flight together.
    const server = await broken('endless', CONTEXT, IN_FLIGHT);
    regen = await spawnServer(data.dir, {
      // One attempt a sample: every answer is endless, a retry would only be another.
      REGEN_MAX_SERVER_FAULTS: '1',
      REGEN_ADAPTIVE_CONCURRENCY: 'false',
    });
    const base = regen.url;
    const ep = await registerEndpoint(base, server.url, { max_concurrency: IN_FLIGHT });
    const endpoint = async () => (await call(base, `/v1/endpoints/${ep.id}`)).body;
    await waitFor('the endpoint ready', async () => ((await endpoint()).state === 'ready' ? true : undefined));

    const runs = await bufferedAndStreamed(base, IN_FLIGHT / 2);
    for (const id of Object.values(runs)) await waitForStatus(base, id, ENDED, 300_000);

    const peak = peakRssMiB(regen.proc.pid!);
    console.log(`regen's peak RSS with ${IN_FLIGHT} endless answers in flight: ${Math.round(peak)} MiB`);
    expect(peak).toBeLessThan(RSS_LIMIT_MIB);
    // The budget cut some answers, and gave their samples back unspent: they were asked again.
    expect(server.completions).toBeGreaterThan(IN_FLIGHT);
    expect(server.streamed).toBeGreaterThanOrEqual(IN_FLIGHT / 2);
    expect(server.completions - server.streamed).toBeGreaterThanOrEqual(IN_FLIGHT / 2);
    const samples = (await Promise.all(Object.values(runs).map((id) => listAllSamples(base, id)))).flat();
    expect(samples).toHaveLength(IN_FLIGHT);
    expect(new Set(samples.map((s) => s.error?.code))).toEqual(new Set(['answer_too_large']));
    // A sample fails only at its own bound, the server's fault; never at regen's memory budget.
    const messages = samples.map((s) => s.error.message as string);
    expect(messages.every((m) => m.includes('more than its request can produce'))).toBe(true);
    // The server answered every time: its connection is not what failed.
    expect((await endpoint()).state).toBe('ready');
  });
});

describe('answers that are not answers', () => {
  let regen: Awaited<ReturnType<typeof startTestServer>>;
  afterEach(async () => {
    await regen?.cleanup();
  });

  async function start(fault: AnswerFault): Promise<{ base: string; server: BrokenServer; unhealthySeen: () => boolean; stop: () => void }> {
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
    return { base, server, unhealthySeen: () => seen, stop: () => (watching = false) };
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
    const good = await createRun(base, { model: MODEL, input: { requests: requests(2, 'g') }, quality: false });
    const done = await waitForStatus(base, good.id, ENDED);
    stop();
    expect(done.usage).toEqual({ prompt_tokens: 2 * GOOD_USAGE.prompt_tokens, completion_tokens: 2 * GOOD_USAGE.completion_tokens, reasoning_tokens: 0 });
    const metrics = (await call(base, '/metrics')).body as string;
    const tokens = /^regen_completion_tokens_total\{[^}]*\} (\S+)$/m.exec(metrics)?.[1];
    expect(tokens).toBe(String(2 * GOOD_USAGE.completion_tokens));
  });
});
