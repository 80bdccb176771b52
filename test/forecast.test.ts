import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { aheadOf, bootstrapMean, calibrationSeqs, computeForecast, seededRandom, type ForecastInput } from '../src/domain/forecast.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, REGEN, startTestServer, tempDir, waitFor } from './support/server.js';
import { createRun, listAllSamples, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

describe('the calibration slice', () => {
  it('takes one position in each of K equal strata, the same for the same run', () => {
    const seqs = calibrationSeqs('run_a', 1000, 100);
    expect(seqs).toHaveLength(100);
    seqs.forEach((s, i) => {
      expect(s).toBeGreaterThanOrEqual(i * 10);
      expect(s).toBeLessThan((i + 1) * 10);
    });
    expect(calibrationSeqs('run_a', 1000, 100)).toEqual(seqs);
    expect(calibrationSeqs('run_b', 1000, 100)).not.toEqual(seqs);
    // A slice larger than the input is the whole input.
    expect(calibrationSeqs('run_a', 7, 200)).toEqual([0, 1, 2, 3, 4, 5, 6]);
    expect(calibrationSeqs('run_a', 7, 0)).toEqual([]);
  });
});

describe('computeForecast', () => {
  // An input ordered short to long: position i answers with 100 + i tokens.
  const slice = calibrationSeqs('run_f', 10_000, 200).map((s) => [s, 100 + s] as const);
  const base: ForecastInput = {
    whole: false,
    total: 10_000,
    remaining: 9_000,
    completionTokens: 0,
    slice,
    sliceOpen: 0,
    frontier: 999,
    tokensPerSecond: 10_000,
    endpoints: 2,
    elapsedSeconds: 0,
    deadlineSeconds: null,
    now: 0,
  };

  it('takes the remaining mean from the slice ahead of the frontier, not from the whole slice', () => {
    const ahead = aheadOf(slice, 999);
    expect(ahead).toHaveLength(180);
    const f = computeForecast(base, seededRandom('t'))!;
    // The true mean of positions 1000..9999 is 100 + 5499.5; the whole slice's would be ~5100.
    expect(f.completion_tokens_remaining / 9000).toBeGreaterThan(5100 + 200);
    expect(Math.abs(f.completion_tokens_remaining / 9000 - 5599.5) / 5599.5).toBeLessThan(0.03);
    expect(f.wall_seconds_remaining).toBeCloseTo(f.completion_tokens_remaining / 10_000, 0);
    expect(f.low!).toBeLessThan(f.wall_seconds_remaining!);
    expect(f.high!).toBeGreaterThan(f.wall_seconds_remaining!);
    expect(f.based_on_samples).toBe(slice.length);
    // Near the end fewer slice answers lie ahead; the nearest behind make up MIN_AHEAD.
    expect(aheadOf(slice, 9_990)).toHaveLength(10);
  });

  it('says how many endpoints meet a deadline: about twice as many for half the time', () => {
    const whole = { ...base, whole: true, deadlineSeconds: 600 };
    const f = computeForecast(whole, seededRandom('t'))!;
    // 10,000 × ~5100 tokens at 5,000 tokens/s an endpoint: ~10,200 s on one endpoint.
    expect(f.endpoints_for_deadline).toBe(Math.ceil(f.completion_tokens_remaining / 5000 / 600));
    const half = computeForecast({ ...whole, deadlineSeconds: 300 }, seededRandom('t'))!;
    expect(Math.abs(half.endpoints_for_deadline! - 2 * f.endpoints_for_deadline!)).toBeLessThanOrEqual(1);
  });

  it('has no wall time without a rate, and falls back to the completed mean without a slice', () => {
    const noRate = computeForecast({ ...base, tokensPerSecond: 0, endpoints: 0 }, seededRandom('t'))!;
    expect(noRate.wall_seconds_remaining).toBeNull();
    expect(noRate.finishes_at).toBeNull();
    expect(computeForecast({ ...base, slice: [], remaining: 10_000 }, seededRandom('t'))).toBeNull();
    // Nine answers of a slice still being answered are not enough to go on.
    expect(computeForecast({ ...base, slice: slice.slice(0, 9), sliceOpen: 191 }, seededRandom('t'))).toBeNull();
    const noSlice = computeForecast({ ...base, slice: [], completionTokens: 100_000 }, seededRandom('t'))!;
    expect(noSlice.completion_tokens_remaining).toBe(900_000);
    expect(noSlice.low).toBe(noSlice.high);
  });

  it('ends a settled run at its elapsed time, even with no endpoint up to give a rate', () => {
    const settled = { ...base, remaining: 0, completionTokens: 5_000_000, elapsedSeconds: 321, now: 1_000_000 };
    for (const rate of [10_000, 0]) {
      const f = computeForecast({ ...settled, tokensPerSecond: rate, endpoints: rate ? 2 : 0 }, seededRandom('t'))!;
      expect(f).toMatchObject({
        completion_tokens_remaining: 0,
        completion_tokens_estimate: 5_000_000,
        wall_seconds_remaining: 0,
        wall_seconds_estimate: 321,
        low: 0,
        high: 0,
        finishes_at: 1_000_000,
      });
    }
  });

  it('bootstraps a 90% interval of the mean', () => {
    const lengths = Array.from({ length: 200 }, (_, i) => (i % 10) * 100);
    const { low, high } = bootstrapMean(lengths, seededRandom('b'));
    // Mean 450, standard error ≈ 287 / √200 ≈ 20: the 5th and 95th percentiles lie ~33 either side.
    expect(low).toBeGreaterThan(400);
    expect(low).toBeLessThan(440);
    expect(high).toBeGreaterThan(460);
    expect(high).toBeLessThan(500);
  });

  it('takes the normal approximation of the same interval for a large slice, without resampling', () => {
    const lengths = Array.from({ length: 5000 }, (_, i) => (i % 10) * 100);
    const { low, high } = bootstrapMean(lengths, () => {
      throw new Error('no resampling past BOOTSTRAP_MAX_LENGTHS');
    });
    // Mean 450, standard error ≈ 287 / √5000 ≈ 4.06: 1.645 of them either side.
    expect(low).toBeCloseTo(450 - 6.68, 1);
    expect(high).toBeCloseTo(450 + 6.68, 1);
  });
});

// Answers from 40 to 400 tokens, in input order: the old ETA, from the first (short) answers' rate in
// samples, was far off on such an input. Each answer takes 1.1 s to 2 s of the simulator's time (a
// second before the first token, then 400 tokens a second), 16 at once: about ten answers a
// second, and the simulator's stream ticks and regen's reading of them a few percent of a core. So
// the simulator's clock sets the wall time, not a loaded machine's: at 1,000 tokens a second from
// the first 20 ms, 32 at once, 120 answers a second of ten-millisecond ticks starved on a busy
// machine, and a dry run measured under another load than its run was 35% off.
const SAMPLES = 160;
const MIN_LEN = 40;
const MAX_LEN = 400;
const CAP = 16;
const TOKENS_PER_SECOND = 400;
const TTFT_MS = 1000;
/** The calibration slice of these runs: two rounds of the cap, enough to measure the speed and the lengths. */
const SLICE = 2 * CAP;
/** The deadline `regen plan` is asked about: a quarter of the run's wall time. */
const PLAN_DEADLINE_S = 4;
const lengthAt = (i: number) => Math.round(MIN_LEN + ((MAX_LEN - MIN_LEN) * i) / (SAMPLES - 1));
const jsonl =
  Array.from({ length: SAMPLES }, (_, i) =>
    JSON.stringify({ custom_id: `s-${i}`, messages: [{ role: 'user', content: `question ${i} [len=${lengthAt(i)}]` }] }),
  ).join('\n') + '\n';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

describe('the forecast against real runs on simulator processes', () => {
  const files = tempDir('regen-plan-');
  let server: Awaited<ReturnType<typeof startTestServer>>;
  let sim: SimProcess;
  let fileId: string;

  beforeAll(async () => {
    // A run of this input takes about 16 s: 160 answers of 1.55 s on average, 16 at once.
    sim = await spawnSimulator({ model: 'sim-forecast', 'tokens-per-second': TOKENS_PER_SECOND, 'ttft-ms': TTFT_MS, 'max-running': CAP });
    server = await startTestServer();
    await registerEndpoint(server.url, sim.url, { max_concurrency: CAP });
    fileId = await uploadFile(server.url, jsonl);
  });

  afterAll(async () => {
    await server?.cleanup();
    await sim?.stop();
    files.cleanup();
  });

  const body = (extra: Record<string, unknown>) => ({
    model: 'sim-forecast',
    input: { file_id: fileId },
    shard_size: 250,
    quality: false,
    calibration: { samples: SLICE },
    ...extra,
  });
  const answered = async () => (await sim.stats()).completed;

  let dryEstimate = 0;
  let dryTokens = 0;

  it('a dry run answers its slice only, and says how many endpoints meet a deadline', async () => {
    const before = await answered();
    const dry = await createRun(server.url, body({ dry_run: true, deadline_seconds: 4 }));
    const done = await waitForStatus(server.url, dry.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    expect(done.dry_run).toBe(true);
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SLICE, failed: 0, cancelled: SAMPLES - SLICE });
    expect((await answered()) - before).toBe(SLICE);
    const f = done.forecast;
    expect(f.based_on_samples).toBe(SLICE);
    expect(f.fleet.endpoints).toBe(1);
    expect(f.low).toBeLessThan(f.wall_seconds_estimate);
    expect(f.high).toBeGreaterThan(f.wall_seconds_estimate);
    dryEstimate = f.wall_seconds_estimate;
    dryTokens = f.completion_tokens_estimate;
    const fourSeconds = f.endpoints_for_deadline;
    // The estimate shown is rounded to a tenth; the endpoints were counted from the unrounded one.
    expect([Math.ceil((f.wall_seconds_estimate - 0.05) / 4), Math.ceil((f.wall_seconds_estimate + 0.05) / 4)]).toContain(fourSeconds);

    // Half the deadline, from a second dry run's own measurement (two measurements differ by the
    // machine's noise): about twice the endpoints its estimate needs for four seconds.
    const half = await createRun(server.url, body({ dry_run: true, deadline_seconds: 2 }));
    const halfDone = await waitForStatus(server.url, half.id, ['completed', 'failed', 'paused', 'cancelled']);
    const wall = halfDone.forecast.wall_seconds_estimate;
    const forFour = [Math.ceil((wall - 0.05) / 4), Math.ceil((wall + 0.05) / 4)];
    expect(forFour.some((n) => Math.abs(halfDone.forecast.endpoints_for_deadline - 2 * n) <= 1)).toBe(true);
    expect(Math.abs(wall - dryEstimate) / dryEstimate).toBeLessThan(0.5);
  });

  it('the dry run and the live estimate at 10% are within 25% of the real wall time; no slice sample is answered twice', async () => {
    const before = await answered();
    const run = await createRun(server.url, body({}));
    // The ETA is the runner's live forecast. Until the live view carries one (the row's stored
    // forecast can be there first, on a loaded machine a few seconds first), it is the rate's.
    const early = await waitFor(
      'the run to pass 10% with its ETA from the forecast',
      async () => {
        const r = (await call(server.url, `/v1/runs/${run.id}`)).body;
        const forecast = r.forecast?.wall_seconds_estimate != null;
        return r.progress.fraction >= 0.1 && forecast && r.progress.eta_seconds === Math.ceil(r.forecast.wall_seconds_remaining) ? r : undefined;
      },
      60_000,
      50,
    );
    const done = await waitForStatus(server.url, run.id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ completed: SAMPLES, failed: 0, cancelled: 0 });
    expect((await answered()) - before).toBe(SAMPLES);
    const wall = (Date.parse(done.finished_at) - Date.parse(done.started_at)) / 1000;
    const off = (estimate: number) => Math.abs(estimate - wall) / wall;
    // A forecast takes the slots as kept full. How full regen kept them (request-seconds over cap ×
    // wall time) is logged: a machine too loaded to dispatch on time shows there, not as a bad forecast.
    const requestSeconds = (await listAllSamples(server.url, run.id)).reduce((n, x) => n + (x.latency_ms ?? 0), 0) / 1000;
    console.log(
      `forecast: ${JSON.stringify({ wall_seconds: wall, slots_full: requestSeconds / (CAP * wall), dry_run_estimate: dryEstimate, dry_run_off: off(dryEstimate), at_10_percent: early.forecast.wall_seconds_estimate, at_10_percent_off: off(early.forecast.wall_seconds_estimate), dry_run_tokens: dryTokens, tokens: done.usage.completion_tokens })}`,
    );
    expect(Math.abs(dryTokens - done.usage.completion_tokens) / done.usage.completion_tokens).toBeLessThan(0.1);
    expect(off(dryEstimate), `dry run ${dryEstimate} s against ${wall} s`).toBeLessThan(0.25);
    expect(off(early.forecast.wall_seconds_estimate), `at 10%: ${early.forecast.wall_seconds_estimate} s against ${wall} s`).toBeLessThan(0.25);
  });

  it('`regen plan` uploads, dry-runs, waits and prints tokens, wall time, endpoint-hours and endpoints for the deadline', async () => {
    const path = join(files.dir, 'plan.jsonl');
    writeFileSync(path, jsonl);
    const before = await answered();
    const child = spawn(
      process.execPath,
      [...REGEN, 'plan', path, '--model', 'sim-forecast', '--samples', String(SLICE), '--deadline', `${PLAN_DEADLINE_S}s`, '--param', 'temperature=0.6'],
      {
        cwd: ROOT,
        env: { ...process.env, REGEN_URL: server.url },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code, stderr).toBe(0);
    expect((await answered()) - before).toBe(SLICE);
    const field = (label: string) =>
      stdout
        .split('\n')
        .find((l) => l.startsWith(label))
        ?.slice(label.length)
        .trim();
    expect(field('samples')).toMatch(new RegExp(`^${SAMPLES} \\(forecast from ${SLICE} calibration answers, dry run run_`));
    expect(Number(field('completion tokens')!.replaceAll(',', ''))).toBeGreaterThan(SAMPLES * MIN_LEN);
    expect(field('fleet')).toMatch(/^1 endpoint\(s\), [\d,]+ completion tokens\/s at their caps$/);
    expect(field('wall time')).toMatch(/^(\d+m )?\d+s \(90% interval (\d+m )?\d+s to (\d+m )?\d+s\)$/);
    expect(Number(field('endpoint-hours'))).toBeGreaterThan(0);
    // About 16 s of work at the simulator's speed against 4 s: four endpoints, two at the least
    // whatever a loaded machine does to the answers measured. As many as the printed wall time
    // (rounded to a second) takes at 4 s an endpoint.
    const [, minutes, seconds] = /^(?:(\d+)m )?(\d+)s /.exec(field('wall time')!)!;
    const wall = Number(minutes ?? 0) * 60 + Number(seconds);
    const needed = Number(/^(\d+) endpoint\(s\) like the current ones$/.exec(field(`deadline ${PLAN_DEADLINE_S}s`)!)?.[1]);
    expect(needed).toBeGreaterThanOrEqual(2);
    expect(needed).toBeGreaterThanOrEqual(Math.ceil((wall - 0.5) / PLAN_DEADLINE_S));
    expect(needed).toBeLessThanOrEqual(Math.ceil((wall + 0.5) / PLAN_DEADLINE_S));
  });

  it('a dry run paused once its whole slice is claimed ends when resumed', async () => {
    // Answers of three seconds, a slice smaller than the cap: one claim takes all of it, and the pause
    // lands while every slice sample is in flight, so nothing of the slice is left to claim after.
    const PAUSED_SLICE = CAP / 2;
    const slow = await uploadFile(
      server.url,
      Array.from({ length: 100 }, (_, i) =>
        JSON.stringify({ custom_id: `p-${i}`, messages: [{ role: 'user', content: `q ${i} [len=${2 * TOKENS_PER_SECOND}]` }] }),
      ).join('\n'),
    );
    const dry = await createRun(server.url, { ...body({ dry_run: true, calibration: { samples: PAUSED_SLICE } }), input: { file_id: slow } });
    await waitFor(
      'the whole slice in flight',
      async () => ((await call(server.url, `/v1/runs/${dry.id}`)).body.request_counts.in_progress === PAUSED_SLICE ? true : undefined),
      30_000,
      50,
    );
    expect((await call(server.url, `/v1/runs/${dry.id}/pause`, { method: 'POST', json: {} })).status).toBe(200);
    const paused = await waitFor('the slice answered while paused', async () => {
      const r = (await call(server.url, `/v1/runs/${dry.id}`)).body;
      return r.request_counts.completed === PAUSED_SLICE ? r : undefined;
    });
    expect(paused.status).toBe('paused');
    expect((await call(server.url, `/v1/runs/${dry.id}/resume`, { method: 'POST', json: {} })).status).toBe(200);
    const done = await waitForStatus(server.url, dry.id, ['completed', 'failed', 'cancelled'], 30_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ completed: PAUSED_SLICE, cancelled: 100 - PAUSED_SLICE });
    expect(done.forecast.based_on_samples).toBe(PAUSED_SLICE);
  });

  it('refuses a dry run without a slice, naming the field', async () => {
    const res = await call(server.url, '/v1/runs', { method: 'POST', json: body({ dry_run: true, calibration: { samples: 0 } }) });
    expect(res.status).toBe(422);
    expect(JSON.stringify(res.body)).toContain('calibration.samples');
  });
});
