import { appendFileSync, readFileSync } from 'node:fs';
import { relative } from 'node:path';
import { afterAll, beforeAll, expect } from 'vitest';

// `REGEN_TEST_CPU=FILE CI=true npx vitest run` appends a JSON line for each test file to FILE: the CPU seconds
// of its worker process (every thread: the in-process servers and their runner threads included)
// and of the processes it started and reaped (servers, simulators, Chromium, CLIs), and its wall
// seconds, from its first hook to its last (its imports before them are not counted). A worker runs
// one file at a time (vitest.config.ts), so the figures are the file's own. Linux only (/proc);
// PostgreSQL's backends are not counted. A measurement that fails says so and fails nothing: the
// `pg` project's databases are dropped by the hook after this one.
const out = process.env.REGEN_TEST_CPU;

/** The CPU this process has used, and that of its children it has waited for, in seconds. */
function cpuSeconds(): number {
  const own = process.cpuUsage();
  // /proc/self/stat after the command's closing parenthesis: cutime and cstime are fields 14 and
  // 15 there (from 1), in clock ticks of 1/100 s.
  const fields = readFileSync('/proc/self/stat', 'utf8').split(')').pop()!.trim().split(/\s+/);
  return (own.user + own.system) / 1e6 + (Number(fields[13]) + Number(fields[14])) / 100;
}

if (out) {
  let cpu = 0;
  let wall = 0;
  beforeAll(() => {
    wall = performance.now();
    try {
      cpu = cpuSeconds();
    } catch {
      cpu = Number.NaN;
    }
  });
  afterAll(() => {
    const file = relative(process.cwd(), expect.getState().testPath ?? '?');
    try {
      const line = {
        file,
        store: process.env.REGEN_TEST_STORE ?? 'sqlite',
        cpu_s: Number((cpuSeconds() - cpu).toFixed(2)),
        wall_s: Number(((performance.now() - wall) / 1000).toFixed(2)),
      };
      appendFileSync(out, `${JSON.stringify(line)}\n`);
    } catch (err) {
      console.error(`REGEN_TEST_CPU: ${file} not measured: ${(err as Error).message}`);
    }
  });
}
