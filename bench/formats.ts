import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, statfsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Figure, scaled } from './support.js';

// Output formats side by side (`npm run bench formats`): the shard writer's code path on synthetic
// completed samples, one child process a format (its peak RSS its own), 1,000-sample shards into a
// local store, each read back and checked. JSONL is the baseline; Parquet is hyparquet-writer
// (the writer regen uses), and parquet-wasm (zstd) the writer it was chosen over.

const WORKER = fileURLToPath(new URL('./formats-worker.ts', import.meta.url));
const SHARD = 1000;
/** Bytes a synthetic sample's JSONL line takes (measured: ~3 KB): what the free-disk check budgets for. */
const LINE_BYTES = 3100;

interface Result {
  format: string;
  samples: number;
  wallMs: number;
  encodeMs: number;
  bytes: number;
  peakRssMiB: number;
}

async function measure(format: string, samples: number): Promise<Result> {
  const dir = mkdtempSync(join(tmpdir(), `regen-bench-${format}-`));
  try {
    const child = spawn(process.execPath, ['--import', 'tsx', WORKER, format, String(samples), String(SHARD), dir], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    const code = await new Promise<number | null>((r) => child.on('exit', r));
    if (code !== 0) throw new Error(`${format} writer exited with ${code}`);
    return JSON.parse(out) as Result;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export async function benchFormats(): Promise<Figure[]> {
  let samples = scaled(1_000_000, 2000);
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
  const jsonl = await measure('jsonl', samples);
  const parquet = await measure('parquet', samples);
  const conversations = await measure('conversations', samples);
  // The writer comparison, on a tenth of the samples: it chose the writer, it is not what runs.
  const writers = Math.max(SHARD, Math.round(samples / 10 / SHARD) * SHARD);
  const hyp = await measure('parquet', writers);
  const wasm = await measure('parquet-wasm', writers);

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
    fig(`samples/s written, conversations vs JSONL, ${n} samples`, rate(conversations), rate(jsonl), 'samples/s'),
    fig(`bytes written, Parquet (SNAPPY) vs JSONL, ${n} samples`, mib(parquet.bytes), mib(jsonl.bytes), 'MiB', true),
    fig(`bytes written, conversations vs JSONL, ${n} samples`, mib(conversations.bytes), mib(jsonl.bytes), 'MiB', true),
    fig('writer peak RSS, Parquet vs JSONL', parquet.peakRssMiB, jsonl.peakRssMiB, 'MiB', true),
    fig(
      `encode time (line → record → shard bytes), hyparquet-writer (SNAPPY) vs parquet-wasm + apache-arrow (ZSTD), ${writers.toLocaleString('en')} samples`,
      hyp.encodeMs / 1000,
      wasm.encodeMs / 1000,
      's',
      true,
    ),
    fig('bytes, hyparquet-writer (SNAPPY) vs parquet-wasm (ZSTD)', mib(hyp.bytes), mib(wasm.bytes), 'MiB', true),
    fig('writer peak RSS, hyparquet-writer vs parquet-wasm', hyp.peakRssMiB, wasm.peakRssMiB, 'MiB', true),
  ];
}
