import { defineConfig } from 'vitest/config';
import DurationsReporter from './test/support/durations-reporter.js';
import { LongestFirst } from './test/support/sequencer.js';

// The soak runs (test/soak, minutes each) run only under `npm run soak`, which sets REGEN_SOAK.
const soak = process.env.REGEN_SOAK === '1';

// The tests that run once, in the sqlite project: those that need no store (pure functions, the
// simulator, the document's lint, the bench's own smoke run, the PostgreSQL tests that make their
// own databases), and those whose store holds nothing what they prove depends on (each file says
// why in its header: probing SGLang, the quality verdicts made in memory, the plan's arithmetic,
// an answer's memory bound, the bind refusal before any store opens).
const storeless = [
  'test/unit/**',
  'test/affinity-replicas.test.ts',
  'test/bench.test.ts',
  'test/cache-usage.test.ts',
  'test/entry.test.ts',
  'test/fault-answers-memory.test.ts',
  'test/grafana.test.ts',
  'test/input-format.test.ts',
  'test/layout.test.ts',
  'test/openapi-lint.test.ts',
  'test/pg-connections.test.ts',
  'test/pg-schema.test.ts',
  'test/plan.test.ts',
  'test/quality-gate2.test.ts',
  'test/quality.test.ts',
  'test/replica-staleness.test.ts',
  'test/replicas.test.ts',
  'test/secret-key-roll.test.ts',
  'test/sample-batches.test.ts',
  'test/security-bind.test.ts',
  'test/sglang.test.ts',
  'test/sim-priority.test.ts',
  'test/sim-sglang.test.ts',
  'test/sim.test.ts',
];

function workers(): number {
  const raw = process.env.REGEN_TEST_WORKERS ?? '3';
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) throw new Error(`REGEN_TEST_WORKERS must be a positive integer (got ${JSON.stringify(raw)})`);
  return n;
}

export default defineConfig({
  test: {
    testTimeout: 120_000,
    hookTimeout: 120_000,
    // Three files at once on a 2-core machine: much of the suite waits on simulated time (slow
    // simulators, forecasts, takeovers), and with two the cores sat idle a third of the run (1,003 s,
    // mean idle 35%); three took 836 and 860 s (idle 13% and 10%) with no test failed by the load
    // (BENCHMARKS.md, 2026-12-07). Four once pushed the load past 14 and tests waiting on real answers ran out of
    // time (README, Development). REGEN_TEST_WORKERS=N changes it: vitest's `--maxWorkers` on the
    // command line does not reach the projects below.
    maxWorkers: workers(),
    // A worker runs file after file of its project in one process: a new process and its imports
    // for each file cost about a second of CPU, which the two cores are short of. Each file still
    // starts and stops its own servers, simulators and databases, and sets no process-wide state
    // it does not restore (the S3 variables, test/support/fault-rig.ts).
    isolate: false,
    // Tags this run's PostgreSQL databases, and fails the run if any is left behind.
    globalSetup: ['test/support/global-setup.ts'],
    // `npm run test:durations` also records each file's time (test/durations.json), which orders the next runs.
    reporters: process.env.REGEN_TEST_DURATIONS === '1' ? ['default', new DurationsReporter()] : ['default'],
    // The longest files first, both projects mixed: the suite ends when its last file does.
    sequence: { sequencer: LongestFirst },
    // The same suite on both stores (test/support/store.ts): SQLite files, and a PostgreSQL database
    // of its own for each server a test starts.
    projects: [
      {
        extends: true,
        test: {
          name: 'sqlite',
          setupFiles: ['test/support/cpu-by-file.ts'],
          include: soak ? ['test/soak/**/*.test.ts'] : ['test/**/*.test.ts'],
          exclude: soak ? [] : ['test/soak/**', 'node_modules/**'],
        },
      },
      {
        extends: true,
        test: {
          name: 'pg',
          include: soak ? [] : ['test/**/*.test.ts'],
          exclude: ['test/soak/**', 'node_modules/**', ...storeless],
          env: { REGEN_TEST_STORE: 'pg' },
          // cpu-by-file.ts first: afterAll hooks run last-registered first, so the databases are dropped after it.
          setupFiles: ['test/support/cpu-by-file.ts', 'test/support/store-setup.ts'],
        },
      },
    ],
  },
});
