import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, statfsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Figure, scaled } from './support.js';

// Output formats side by side (`npm run bench formats`): the shard writer's code path on synthetic
// completed samples, one child process a format (its peak RSS its own), 1,000-sample shards into a
// local store, each read back and checked. JSONL is the baseline; Parquet is hyparquet-writer
// (the writer regen uses), and parquet-wasm (zstd) the writer it was chosen over. The formats take
// turns, a tenth of the samples each per round, so a machine whose load changes meanwhile weighs on
// all of them alike; CPU time, which the load does not stretch, is reported beside wall time.

// The worker runs as this module was loaded: through tsx, or compiled (the tests' build).
const compiled = import.meta.url.endsWith('.js');
const WORKER = fileURLToPath(new URL(compiled ? './formats-worker.js' : './formats-worker.ts', import.meta.url));
// --expose-gc: the worker collects each shard's synthetic samples' garbage before its clock starts (formats-worker.ts).
const NODE_ARGS = ['--expose-gc', ...(compiled ? [WORKER] : ['--import', 'tsx', WORKER])];
const SHARD = 1000;
/** Bytes a synthetic sample's JSONL line takes (measured: ~3 KB): what the free-disk check budgets for. */
const LINE_BYTES = 3100;

interface Result {
  format: string;
  samples: number;
  wallMs: number;
  cpuMs: number;
  encodeMs: number;
  bytes: number;
  stagedBytes: number;
  peakRssMiB: number;
}

const ROUNDS = 10;

async function measureOnce(format: string, samples: number, first: number): Promise<Result> {
  const dir = mkdtempSync(join(tmpdir(), `regen-bench-${format}-`));
  try {
    const child = spawn(process.execPath, [...NODE_ARGS, format, String(samples), String(SHARD), dir, String(first)], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    const code = await new Promise<number | null>((r) => child.on('exit', r));
    if (code !== 0) throw new Error(`${format} writer exited with ${code}`);
    return JSON.parse(out) as Result;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Each format in turn, round after round; times and bytes summed, the peak RSS the highest. */
async function measureAll(formats: string[], samples: number): Promise<Map<string, Result>> {
  const per = Math.max(SHARD, Math.ceil(samples / ROUNDS / SHARD) * SHARD);
  const total = new Map<string, Result>();
  for (let first = 0; first < samples; first += per) {
    for (const format of formats) {
      const r = await measureOnce(format, Math.min(per, samples - first), first);
      const t = total.get(format);
      total.set(
        format,
        t
          ? {
              ...t,
              samples: t.samples + r.samples,
              wallMs: t.wallMs + r.wallMs,
              cpuMs: t.cpuMs + r.cpuMs,
              encodeMs: t.encodeMs + r.encodeMs,
              bytes: t.bytes + r.bytes,
              stagedBytes: t.stagedBytes + r.stagedBytes,
              peakRssMiB: Math.max(t.peakRssMiB, r.peakRssMiB),
            }
          : r,
      );
    }
  }
  return total;
}

export async function benchFormats(): Promise<Figure[]> {
  let samples = scaled(1_000_000, SHARD);
  // One format's files at a time are on disk; the JSONL ones are the largest. Keep twice that free.
  const free = (() => {
    const s = statfsSync(tmpdir());
    return s.bavail * s.bsize;
  })();
  const need = samples * LINE_BYTES * 2;
  let note = '';
  if (free < need) {
    const fit = Math.floor(free / (LINE_BYTES * 2) / SHARD) * SHARD;
    note = ` (scaled down from ${samples.toLocaleString('en')}: ${(free / 2 ** 30).toFixed(1)} GiB free)`;
    samples = Math.max(SHARD, fit);
  }
  console.error(
    `formats: ${samples} samples, ${(free / 2 ** 30).toFixed(1)} GiB free in ${tmpdir()}${note}; df:\n${execFileSync('df', ['-h', tmpdir()]).toString().trim()}`,
  );
  const formats = ['jsonl', 'parquet', 'conversations', 'jsonl+tokens', 'parquet+tokens', 'tokens-file'] as const;
  const main = await measureAll([...formats], samples);
  const [jsonl, parquet, conversations, jsonlTokens, parquetTokens, file] = formats.map((f) => main.get(f)!) as [
    Result,
    Result,
    Result,
    Result,
    Result,
    Result,
  ];
  // The writer comparison, on a tenth of the samples: it chose the writer, it is not what runs.
  const writers = Math.max(SHARD, Math.round(samples / 10 / SHARD) * SHARD);
  const compared = await measureAll(['parquet-hyp', 'parquet-wasm'], writers);
  const [hyp, wasm] = [compared.get('parquet-hyp')!, compared.get('parquet-wasm')!];

  const n = samples.toLocaleString('en');
  const rate = (r: Result) => r.samples / (r.wallMs / 1000);
  const mib = (b: number) => b / 2 ** 20;
  const fig = (figure: string, regen: number, baseline: number | null, unit: string, lowerIsBetter = false, target = 'reported'): Figure => ({
    part: 'formats',
    figure,
    regen,
    baseline,
    unit,
    ratio: baseline === null ? null : lowerIsBetter ? baseline / regen : regen / baseline,
    target,
    ok: null,
  });
  return [
    fig(
      `samples/s written, Parquet vs JSONL, ${n} samples${note} in ${SHARD}-sample shards, each read back and checked`,
      rate(parquet),
      rate(jsonl),
      'samples/s',
    ),
    fig(`CPU seconds, Parquet vs JSONL, ${n} samples (load does not stretch CPU time)`, parquet.cpuMs / 1000, jsonl.cpuMs / 1000, 's', true),
    fig(`samples/s written, conversations vs JSONL, ${n} samples`, rate(conversations), rate(jsonl), 'samples/s'),
    fig(`CPU seconds, conversations vs JSONL, ${n} samples`, conversations.cpuMs / 1000, jsonl.cpuMs / 1000, 's', true),
    fig(`bytes written, Parquet (SNAPPY) vs JSONL, ${n} samples`, mib(parquet.bytes), mib(jsonl.bytes), 'MiB', true),
    fig(`bytes written, conversations vs JSONL, ${n} samples`, mib(conversations.bytes), mib(jsonl.bytes), 'MiB', true),
    fig('writer peak RSS, Parquet vs JSONL', parquet.peakRssMiB, jsonl.peakRssMiB, 'MiB', true),
    // output.tokens: the text and its training rows (80 prompt + 600 generated ids a sample) against the text alone.
    fig(`samples/s written, JSONL with tokens vs JSONL, ${n} samples`, rate(jsonlTokens), rate(jsonl), 'samples/s', false, '>= 0.67'),
    fig(`samples/s written, Parquet with tokens vs Parquet, ${n} samples`, rate(parquetTokens), rate(parquet), 'samples/s', false, '>= 0.67'),
    fig(`CPU seconds, JSONL with tokens vs JSONL, ${n} samples`, jsonlTokens.cpuMs / 1000, jsonl.cpuMs / 1000, 's', true),
    // The JSONL training rows' file alone, from ids in memory: its lines made, stored, synced, read
    // back, compared and hashed. However the ids are staged, JSONL with tokens spends at least the
    // text's CPU and this (in CPU, as the upload stores the text and the rows at once, their waits
    // overlapping); the ratio after it is the most its CPU ratio above could reach.
    fig(
      `CPU seconds, the JSONL tokens file alone (from ids in memory: lines made, stored, read back and checked) vs the JSONL text's whole write, ${n} samples`,
      file.cpuMs / 1000,
      jsonl.cpuMs / 1000,
      's',
      true,
    ),
    fig(
      'CPU, the most JSONL with tokens could reach against JSONL, its ids staged for nothing: text ÷ (text + the tokens file alone)',
      (jsonl.cpuMs + file.cpuMs) / 1000,
      jsonl.cpuMs / 1000,
      's',
      true,
    ),
    fig(`CPU seconds, Parquet with tokens vs Parquet, ${n} samples`, parquetTokens.cpuMs / 1000, parquet.cpuMs / 1000, 's', true),
    fig(`bytes written, JSONL with tokens vs JSONL, ${n} samples`, mib(jsonlTokens.bytes), mib(jsonl.bytes), 'MiB', true),
    fig(`bytes written, Parquet with tokens vs Parquet, ${n} samples`, mib(parquetTokens.bytes), mib(parquet.bytes), 'MiB', true),
    fig(
      `staged bytes (database growth until a shard is written), with tokens vs without, ${n} samples`,
      mib(jsonlTokens.stagedBytes),
      mib(jsonl.stagedBytes),
      'MiB',
      true,
    ),
    fig('writer peak RSS, JSONL with tokens vs JSONL', jsonlTokens.peakRssMiB, jsonl.peakRssMiB, 'MiB', true),
    fig('writer peak RSS, Parquet with tokens vs Parquet', parquetTokens.peakRssMiB, parquet.peakRssMiB, 'MiB', true),
    fig(
      `encode time (line → record → shard bytes), hyparquet-writer (SNAPPY) vs parquet-wasm + apache-arrow (ZSTD), ${writers.toLocaleString('en')} samples`,
      hyp.encodeMs / 1000,
      wasm.encodeMs / 1000,
      's',
      true,
    ),
    fig('CPU seconds, hyparquet-writer vs parquet-wasm (whole write, read-back included)', hyp.cpuMs / 1000, wasm.cpuMs / 1000, 's', true),
    fig('bytes, hyparquet-writer (SNAPPY) vs parquet-wasm (ZSTD)', mib(hyp.bytes), mib(wasm.bytes), 'MiB', true),
    fig('writer peak RSS, hyparquet-writer vs parquet-wasm', hyp.peakRssMiB, wasm.peakRssMiB, 'MiB', true),
  ];
}
