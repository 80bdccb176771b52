import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    // Tests start servers and simulator processes; two workers match this machine's two cores.
    maxWorkers: 2,
    reporters: ['default'],
  },
});
