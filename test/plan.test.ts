// `regen plan --endpoints 4` against a real run on four simulator processes: the wall time it
// prints for four endpoints, measured on two, is met within the forecast's own interval. On one
// store (vitest.config.ts, storeless): the forecast is arithmetic over the answers' timings
// (src/domain/forecast.ts), which the store only keeps.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, REGEN, startTestServer, tempDir, waitFor } from './support/server.js';
import { createRun, listAllSamples, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const MODEL = 'sim-plan';

// The sample is one line in each of SAMPLE equal stretches of BLOCK lines, and every line of a
// stretch asks for the same length: the sample's mean is the file's, so what is checked is how the
// forecast scales to the file and to four endpoints, not the luck of the draw. Lengths are skewed
// across stretches, as reasoning lengths are (from 302 tokens down to 2, a mean of about 77 and a
// spread as wide): the interval made of them is about ±22%, room for a loaded machine's noise. They
// go from long to short, so the real run does not end on a long answer alone on the fleet.
const SAMPLE = 64;
const BLOCK = 4;
const LINES = SAMPLE * BLOCK;
const lengthOf = (line: number) => 2 + Math.round(300 * (1 - Math.floor(line / BLOCK) / (SAMPLE - 1)) ** 3);
// 25 tokens a second per request: answers of three seconds on average, long next to regen's own
// work per request (milliseconds, many more on a loaded machine), and few tokens to stream, so
// the CPU the simulators and regen share with other work does not set the pace; 8 at once per
// simulator. The real run is 8 waves of 32 (about 25 s); the dry run answers its 64 lines on two
// simulators (about 12 s).
const SIM = { model: MODEL, 'tokens-per-second': 25, 'ttft-ms': 20, 'max-running': 8, 'reasoning-tokens': 0 };
const CAP = 8;

const jsonl =
  Array.from({ length: LINES }, (_, i) =>
    JSON.stringify({ custom_id: `p-${i}`, messages: [{ role: 'user', content: `question ${i} [len=${lengthOf(i)}]` }] }),
  ).join('\n') + '\n';

/** "1m 3s", "25s" → seconds. */
function seconds(text: string): number {
  const m = /^(?:(\d+)m )?(\d+)s$/.exec(text);
  if (!m) throw new Error(`not a duration of minutes and seconds: ${text}`);
  return Number(m[1] ?? 0) * 60 + Number(m[2]);
}

describe('regen plan --endpoints', () => {
  const files = tempDir('regen-plan-n-');
  let server: Awaited<ReturnType<typeof startTestServer>>;
  const sims: SimProcess[] = [];

  beforeAll(async () => {
    server = await startTestServer({ REGEN_PROBE_INTERVAL_MS: '200' });
    sims.push(...(await Promise.all(Array.from({ length: 4 }, () => spawnSimulator(SIM)))));
  });
  afterAll(async () => {
    await server?.cleanup();
    await Promise.all(sims.map((s) => s.stop()));
    files.cleanup();
  });

  const ready = (n: number) =>
    waitFor(`${n} ready endpoints`, async () => {
      const eps = (await call(server.url, '/v1/endpoints')).body.data;
      return eps.filter((e: any) => e.state === 'ready' && e.model === MODEL).length === n ? true : undefined;
    });

  it('prints a wall time for 4 endpoints, measured on 2, that a real run on 4 meets within its interval; only a sample is uploaded', async () => {
    for (const sim of sims.slice(0, 2)) await registerEndpoint(server.url, sim.url, { max_concurrency: CAP });
    await ready(2);
    const path = join(files.dir, 'prompts.jsonl');
    writeFileSync(path, jsonl);

    const child = spawn(process.execPath, [...REGEN, 'plan', path, '--model', MODEL, '--samples', String(SAMPLE), '--endpoints', '4'], {
      cwd: ROOT,
      env: { ...process.env, REGEN_URL: server.url },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code, stderr).toBe(0);
    const field = (label: string) =>
      stdout
        .split('\n')
        .find((l) => l.startsWith(label))
        ?.slice(label.length)
        .trim();
    expect(field('samples')).toMatch(new RegExp(`^${LINES} \\(forecast from ${SAMPLE} calibration answers, dry run run_`));
    expect(field('uploaded')).toBe(`a sample of ${SAMPLE} lines, one at random in each of as many equal stretches`);
    expect(field('fleet')).toMatch(/^2 endpoint\(s\), /);

    // The dry run had the sample only: its lines, not the file's, were uploaded and answered.
    const dryId = /dry run (run_\S+)\)/.exec(field('samples')!)![1];
    const dry = (await call(server.url, `/v1/runs/${dryId}`)).body;
    expect(dry.request_counts).toMatchObject({ total: SAMPLE, completed: SAMPLE });
    const uploaded = (await call(server.url, `/v1/files/${dry.input.file_id}`)).body;
    expect(uploaded.bytes).toBeLessThan(statSync(path).size / (BLOCK - 1));

    const [, estimate, low, high] = /^((?:\d+m )?\d+s) \(90% interval ((?:\d+m )?\d+s) to ((?:\d+m )?\d+s)\), like the ones measured$/.exec(
      field('on 4 endpoint(s)')!,
    )!;
    // Two endpoints' wall time, halved (both figures are rounded to the second).
    expect(Math.abs(seconds(estimate) - seconds(field('wall time')!.split(' (')[0]) / 2)).toBeLessThanOrEqual(1);

    for (const sim of sims.slice(2)) await registerEndpoint(server.url, sim.url, { max_concurrency: CAP });
    await ready(4);
    // With the quality settings of the dry run: both stream their answers, to stop loops.
    const run = await createRun(server.url, { model: MODEL, input: { file_id: await uploadFile(server.url, jsonl) } });
    const done = await waitForStatus(server.url, run.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.request_counts).toMatchObject({ total: LINES, completed: LINES });
    // The forecast is of the answering: from the first claim to the last answer (writing the output after is not in it).
    const lastAnswer = Math.max(...(await listAllSamples(server.url, run.id)).map((s) => Date.parse(s.completed_at)));
    const wall = (lastAnswer - Date.parse(done.started_at)) / 1000;
    console.log(
      `plan: on 4 endpoints ${estimate} (${low} to ${high}); the real run answered in ${wall} s, ended after ${(Date.parse(done.finished_at) - Date.parse(done.started_at)) / 1000} s`,
    );
    // The printed ends are rounded to the second.
    expect(wall).toBeGreaterThanOrEqual(seconds(low) - 0.5);
    expect(wall).toBeLessThanOrEqual(seconds(high) + 0.5);
  });
});
