import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type SimProcess, spawnSimulator } from '../src/sim/spawn.js';
import { type ServerProcess, spawnServer, tempDir } from '../test/support/server.js';
import { json, memoryOf, scaled, until, uploadFile, writePrompts, type Figure } from './support.js';

// A whole run with `output.tokens` against the same run writing text alone (`npm run bench
// tokens`): the rate a run goes at, not the shard writer's alone (the formats part). Each run has a
// fresh server and two zero-latency simulators answering 600 tokens a sample (400 of them
// reasoning), so the run goes as fast as regen and the simulators let it; the simulators share the
// cores, and so regen's own CPU a sample is reported beside the rate. The two kinds of run take
// turns, round after round, so a load that changes meanwhile weighs on both. Single prompts only:
// a conversation's turns keep their ids packed as staged ids are (BENCHMARKS.md, 2026-12-07), which
// this part does not exercise.

const MODEL = 'bench-model';
const ROUNDS = 2;

interface Measured {
  samples: number;
  wallMs: number;
  serverCpuS: number;
  simCpuS: number;
  peakRssMiB: number;
  outputBytes: number;
}

/** Clock ticks a second, as /proc counts CPU time. */
const TICKS = Number(execFileSync('getconf', ['CLK_TCK']).toString().trim());

/** The CPU a process (all its threads) has used, in seconds, from /proc. */
function cpuOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // utime and stime, the 14th and 15th fields (the 12th and 13th after the name).
  return (Number(fields[11]) + Number(fields[12])) / TICKS;
}

async function measureRun(samples: number, tokens: boolean): Promise<Measured> {
  const tmp = tempDir('regen-bench-tokens-');
  const sims: SimProcess[] = [];
  let server: ServerProcess | undefined;
  try {
    // Every simulator that started is kept to be stopped, even when another did not start.
    const started = await Promise.allSettled(
      [1, 2].map((seed) => spawnSimulator({ model: MODEL, 'max-running': 64, 'max-queue': 100_000, 'completion-tokens': 600, 'reasoning-tokens': 400, seed })),
    );
    for (const s of started) if (s.status === 'fulfilled') sims.push(s.value);
    const failed = started.find((s) => s.status === 'rejected');
    if (failed) throw failed.reason;
    server = await spawnServer(join(tmp.dir, 'data'));
    const url = server.url;
    const file = join(tmp.dir, 'prompts.jsonl');
    await writePrompts(file, samples);
    const fileId = await uploadFile(url, file);
    const run = await json<{ id: string }>(url, '/v1/runs', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, input: { file_id: fileId }, params: { max_tokens: 1024 }, output: { tokens } }),
    });
    type View = { status: string; status_reason: string | null; output_uri: string; request_counts: { completed: number; failed: number } };
    const view = () => json<View>(url, `/v1/runs/${run.id}`);
    await until(
      'validation',
      async () => {
        const r = await view();
        if (r.status === 'failed') throw new Error(`the run failed validation: ${r.status_reason ?? ''}`);
        return r.status === 'queued' ? true : undefined;
      },
      600_000,
      100,
    );
    const pid = server.proc.pid!;
    const cpu0 = cpuOf(pid);
    const simCpu0 = sims.reduce((n, s) => n + cpuOf(s.proc.pid!), 0);
    const t0 = performance.now();
    for (const sim of sims) {
      await json(url, '/v1/endpoints', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ url: sim.url }) });
    }
    const done = await until(
      'completion',
      async () => {
        const r = await view();
        if (r.status === 'paused' || r.status === 'failed') throw new Error(`the run is ${r.status}: ${r.status_reason ?? ''}`);
        return r.status === 'completed' ? r : undefined;
      },
      3_600_000,
      100,
    );
    const wallMs = performance.now() - t0;
    if (done.request_counts.completed !== samples) throw new Error(`${done.request_counts.completed} of ${samples} completed`);
    const manifest = JSON.parse(readFileSync(fileURLToPath(new URL('manifest.json', done.output_uri)), 'utf8')) as {
      files: { bytes: number }[];
    };
    return {
      samples,
      wallMs,
      serverCpuS: cpuOf(pid) - cpu0,
      simCpuS: sims.reduce((n, s) => n + cpuOf(s.proc.pid!), 0) - simCpu0,
      peakRssMiB: memoryOf(pid).peakMiB,
      outputBytes: manifest.files.reduce((n, f) => n + f.bytes, 0),
    };
  } finally {
    // A server that does not stop within its drain is killed: the bench goes on to its next run.
    if (server) {
      const stopping = server.kill('SIGTERM');
      const timer = setTimeout(() => void server?.kill('SIGKILL'), 30_000);
      await stopping;
      clearTimeout(timer);
    }
    await Promise.all(sims.map((s) => s.stop()));
    tmp.cleanup();
  }
}

export async function benchTokens(): Promise<Figure[]> {
  const n = scaled(1_000_000, 500);
  const per = Math.max(1, Math.round(n / ROUNDS));
  const sum = { text: [] as Measured[], tokens: [] as Measured[] };
  for (let round = 0; round < ROUNDS; round++) {
    // Alternating which goes first.
    for (const tokens of round % 2 ? [true, false] : [false, true]) {
      const m = await measureRun(per, tokens);
      (tokens ? sum.tokens : sum.text).push(m);
      console.error(`tokens: round ${round + 1}, ${tokens ? 'with tokens' : 'text alone'}: ${JSON.stringify(m)}`);
    }
  }
  const total = (list: Measured[]) => ({
    samples: list.reduce((a, m) => a + m.samples, 0),
    wallS: list.reduce((a, m) => a + m.wallMs, 0) / 1000,
    serverCpuS: list.reduce((a, m) => a + m.serverCpuS, 0),
    simCpuS: list.reduce((a, m) => a + m.simCpuS, 0),
    peak: Math.max(...list.map((m) => m.peakRssMiB)),
    bytes: list.reduce((a, m) => a + m.outputBytes, 0),
  });
  const [text, tokens] = [total(sum.text), total(sum.tokens)];
  const label = `${(per * ROUNDS).toLocaleString('en')} samples a side in ${ROUNDS} runs, 600 tokens an answer, zero-latency simulators`;
  const fig = (figure: string, regen: number, baseline: number, unit: string, lowerIsBetter: boolean, target = 'reported'): Figure => {
    const ratio = lowerIsBetter ? baseline / regen : regen / baseline;
    return { part: 'tokens', figure, regen, baseline, unit, ratio, target, ok: target === 'reported' ? null : ratio >= 2 / 3 };
  };
  return [
    fig(
      `a run's samples/s with output.tokens against the text alone, ${label}`,
      tokens.samples / tokens.wallS,
      text.samples / text.wallS,
      'samples/s',
      false,
      '>= 0.67',
    ),
    fig(
      `regen's CPU ms a sample (server process, all threads), with tokens against without`,
      (1000 * tokens.serverCpuS) / tokens.samples,
      (1000 * text.serverCpuS) / text.samples,
      'ms',
      true,
      '>= 0.67',
    ),
    fig(
      `the simulators' CPU ms a sample, with tokens against without`,
      (1000 * tokens.simCpuS) / tokens.samples,
      (1000 * text.simCpuS) / text.samples,
      'ms',
      true,
    ),
    fig('server peak RSS (its ingest included), with tokens against without', tokens.peak, text.peak, 'MiB', true),
    fig(
      'bytes of the files the manifest lists (text, tokens, errors, card), with tokens against without',
      tokens.bytes / 2 ** 20,
      text.bytes / 2 ** 20,
      'MiB',
      true,
    ),
  ];
}
