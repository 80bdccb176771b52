import { afterAll, describe, expect, it } from 'vitest';
import { type BrokenServer, bufferedAndStreamed, startBrokenServer } from './support/answer-faults.js';
import { peakRssMiB } from './support/faults.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { listAllSamples, registerEndpoint, waitForStatus } from './support/runner-checks.js';

// What a broken server answers with HTTP 200 must not run regen out of memory. On one store
// (vitest.config.ts, storeless): the answers are held, bounded and cut in the runner's memory, by
// its answer budget and each request's own bound; the store only records each sample's end, a few
// rows, the same on SQLite and PostgreSQL. The other broken answers are fault-answers.test.ts.

const ENDED = ['completed', 'failed', 'cancelled'];
const brokens: BrokenServer[] = [];

describe('an endpoint that streams without end', () => {
  const data = tempDir('regen-fault-answers-');
  let regen: ServerProcess | null = null;
  afterAll(async () => {
    await regen?.kill('SIGKILL');
    await Promise.all(brokens.map((b) => b.close()));
    data.cleanup();
  });

  // A context of 65,536 tokens bounds each answer at about 8 MiB (answerByteLimit): 64 of them
  // would hold twice the default budget of 256 MiB, so the budget cuts some (their samples are
  // given back and asked again, failed at their third cut) and the bound the rest.
  const CONTEXT = 65_536;
  const IN_FLIGHT = 64;
  const RSS_LIMIT_MIB = 1024;

  it('64 requests in flight, buffered and streamed: RSS stays under 1 GiB and every sample fails at its own bound', { timeout: 400_000 }, async () => {
    // Nothing is streamed until all 64 requests have arrived: they are in flight together.
    const server = await startBrokenServer({ fault: 'endless', contextLength: CONTEXT, holdUntil: IN_FLIGHT });
    brokens.push(server);
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
    // A sample fails at its own bound, the server's fault, or once its answer was cut three times
    // to keep regen's memory budget (answer-sheds.ts); never at a single cut.
    const messages = samples.map((s) => s.error.message as string);
    for (const m of messages) expect(m).toMatch(/more than its request can produce|outgrew REGEN_ANSWER_BUFFER_BYTES .*cut 3 times/);
    // The server answered every time: its connection is not what failed.
    expect((await endpoint()).state).toBe('ready');
  });
});
