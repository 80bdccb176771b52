import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { nodeEntry } from './support/build.js';

/**
 * Every part a default `npm run bench` runs, and `tokens`, as the command names them, and the part
 * names their rows carry. Not `conversations`: its turns follow one another at the simulators'
 * decode rate, so even a tiny scale takes minutes.
 */
const PARTS: Record<string, string[]> = {
  // Longest first, so that the lanes below end close together.
  stores: ['stores'],
  scale: ['scale'],
  million: ['reads', 'recovery', 'memory'],
  // Run only when named (bench/index.ts), but its code is kept running here.
  tokens: ['tokens'],
  tail: ['tail'],
  saturation: ['saturation'],
  adaptive: ['adaptive'],
  share: ['share'],
  endless: ['endless'],
  formats: ['formats'],
  dispatch: ['dispatch'],
  stream: ['stream'],
  ingest: ['ingest'],
  variants: ['variants'],
};

/**
 * Parts running at once, each a process of its own with its own servers and simulators on ports of
 * their own: most of a part's time at a tiny scale is servers starting and fixed latencies, which
 * overlap; more would only queue on a 2-core machine's CPU.
 */
const LANES = 3;

/** The part run from the TypeScript through tsx, exactly as `npm run bench` runs it (servers and simulators too); the rest run compiled. */
const THROUGH_TSX = 'dispatch';
/**
 * Small enough that most parts run at their floors (the least each part's sizes allow, bench/):
 * only `scale` (500 and 5,000 samples), `stores` (500 lines) and `formats` (1,000 samples) are above
 * theirs. At 0.002, four times those sizes, this file took a sixth more CPU (240 s against 204 s)
 * to prove the same: that each part runs and reports.
 */
const TINY_SCALE = '0.0005';
/** Generous: a part at a tiny scale takes seconds, but a loaded machine has stretched a server's start past 10 s. */
const PART_MS = 480_000;
/** A wait still going this long after its part started ends with an error naming it (bench/support.ts, `until`), before the part is killed. */
const WAIT_LIMIT_MS = PART_MS - 60_000;

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

/**
 * The bench's PART at a tiny scale, as `npm run bench PART` runs it but compiled (test/support/build.ts);
 * resolves with what it printed on stdout. The part leads a
 * process group of its own, which its servers and simulators join: once it exits, or runs out of
 * time, whatever of it is left goes with it.
 */
function runPart(part: string): Promise<string> {
  const entry = part === THROUGH_TSX ? ['--import', 'tsx', 'bench/index.ts'] : nodeEntry('bench/index.ts');
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...entry, part], {
      env: { ...process.env, BENCH_SCALE: TINY_SCALE, BENCH_WAIT_LIMIT_MS: String(WAIT_LIMIT_MS) },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const group = () => {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        /* the group is empty */
      }
    };
    const timer = setTimeout(group, PART_MS);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      group();
      if (code === 0) resolve(stdout);
      else reject(new Error(`bench ${part} ended with ${code ?? signal}:\n${stderr}`));
    });
  });
}

// The benchmarks are not timed tests: this only proves that every part runs and reports numbers.
describe.concurrent('npm run bench', () => {
  for (const [part, names] of Object.entries(PARTS)) {
    it(
      `${part} runs at a tiny scale and prints a figure for each of its rows`,
      async () => {
        const stdout = await inLane(() => runPart(part));
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
      2 * PART_MS,
    );
  }
});
