#!/usr/bin/env node
// Runs the build `npm ci` made (dist/, scripts/build.js) while it is that of the sources as they
// are; else, or with REGEN_RUN_SOURCES=1, the TypeScript itself through tsx, so that a changed
// file runs as it stands. A server on the build listens in a quarter of the CPU and holds some 90 MiB
// less (BENCHMARKS.md).
import { builtEntry } from './sources.js';

const built = builtEntry();
if (built) {
  await import(built);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import('../src/cli/main.ts');
}
