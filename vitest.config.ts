import { defineConfig } from 'vitest/config';

// The soak runs (test/soak, minutes each) run only under `npm run soak`, which sets REGEN_SOAK.
const soak = process.env.REGEN_SOAK === '1';

export default defineConfig({
  test: {
    include: soak ? ['test/soak/**/*.test.ts'] : ['test/**/*.test.ts'],
    exclude: soak ? [] : ['test/soak/**', 'node_modules/**'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    // Tests start servers and simulator processes; two workers match this machine's two cores.
    maxWorkers: 2,
    reporters: ['default'],
  },
});
