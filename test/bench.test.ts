import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);

// The benchmarks are not timed tests: this only proves that every part runs and reports numbers.
describe('npm run bench', () => {
  it('runs every part at a tiny scale and prints a figure for each', async () => {
    const { stdout } = await run(process.execPath, ['--import', 'tsx', 'bench/index.ts'], {
      env: { ...process.env, BENCH_SCALE: '0.002' },
      maxBuffer: 1 << 24,
      timeout: 480_000,
    });
    const rows = stdout.split('\n').filter((l) => /^\| (ingest|dispatch|saturation|stream|reads|recovery|memory|adaptive|scale|stores) \|/.test(l));
    expect(rows.map((r) => r.split('|')[1].trim())).toEqual(
      expect.arrayContaining(['ingest', 'dispatch', 'saturation', 'stream', 'reads', 'recovery', 'memory', 'adaptive', 'scale', 'stores']),
    );
    for (const row of rows) {
      const regen = row.split('|')[3].trim();
      expect(regen, row).toMatch(/^-?[\d,]+(\.\d+)? \S+/);
      expect(Number.isFinite(Number(regen.split(' ')[0].replace(/,/g, ''))), row).toBe(true);
    }
    // As long as the child is given: every part starts servers and simulators of its own.
  }, 480_000);
});
