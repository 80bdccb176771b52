import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);

/**
 * Every part a default `npm run bench` runs, as the command names it, and the part names its rows
 * carry. Not `conversations`: its turns follow one another at the simulators' decode rate, so even a
 * tiny scale takes minutes.
 */
const PARTS: Record<string, string[]> = {
  ingest: ['ingest'],
  dispatch: ['dispatch'],
  saturation: ['saturation'],
  stream: ['stream'],
  million: ['reads', 'recovery', 'memory'],
  adaptive: ['adaptive'],
  tail: ['tail'],
  scale: ['scale'],
  stores: ['stores'],
  endless: ['endless'],
  variants: ['variants'],
  formats: ['formats'],
};

/**
 * Parts running at once, each a process of its own with its own servers and simulators on ports of
 * their own: most of a part's time at a tiny scale is servers starting and fixed latencies, which
 * overlap; more would only queue on a 2-core machine's CPU.
 */
const LANES = 3;
/** Generous: a part at a tiny scale takes seconds, but a loaded machine has stretched a server's start past 10 s. */
const PART_MS = 300_000;

let free = LANES;
const waiting: (() => void)[] = [];
async function inLane<T>(fn: () => Promise<T>): Promise<T> {
  if (free === 0) await new Promise<void>((r) => waiting.push(r));
  else free--;
  try {
    return await fn();
  } finally {
    const next = waiting.shift();
    if (next) next();
    else free++;
  }
}

// The benchmarks are not timed tests: this only proves that every part runs and reports numbers.
describe.concurrent('npm run bench', () => {
  for (const [part, names] of Object.entries(PARTS)) {
    it(
      `${part} runs at a tiny scale and prints a figure for each of its rows`,
      async () => {
        const { stdout } = await inLane(() =>
          run(process.execPath, ['--import', 'tsx', 'bench/index.ts', part], {
            env: { ...process.env, BENCH_SCALE: '0.002' },
            maxBuffer: 1 << 24,
            timeout: PART_MS,
          }),
        );
        const rows = stdout.split('\n').filter((l) => l.startsWith('| ') && !l.startsWith('| part |'));
        expect(rows.length, stdout).toBeGreaterThan(0);
        expect([...new Set(rows.map((r) => r.split('|')[1].trim()))].sort()).toEqual([...names].sort());
        for (const row of rows) {
          const regen = row.split('|')[3].trim();
          expect(regen, row).toMatch(/^-?[\d,]+(\.\d+)? \S+/);
          expect(Number.isFinite(Number(regen.split(' ')[0].replace(/,/g, ''))), row).toBe(true);
        }
        // As long as the child is given, and the time it may wait for a lane.
      },
      3 * PART_MS,
    );
  }
});
