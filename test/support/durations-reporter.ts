import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import type { Reporter, TestModule } from 'vitest/node';
import { durationKey, DURATIONS_FILE } from './sequencer.js';

/**
 * Records how long each file took (test/durations.json, read by the LongestFirst sequencer), for
 * `npm run test:durations` only: an ordinary run leaves the tree as it found it. Files that ran
 * are updated, the others kept.
 */
export default class DurationsReporter implements Reporter {
  private root = '';

  onInit(ctx: { config: { root: string } }): void {
    this.root = ctx.config.root;
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>, _errors: unknown, reason: string): void {
    // Only a whole run that passed: an interrupted one's files did not take their usual time.
    if (process.env.REGEN_TEST_DURATIONS !== '1' || reason !== 'passed') return;
    const known: Record<string, number> = existsSync(DURATIONS_FILE) ? JSON.parse(readFileSync(DURATIONS_FILE, 'utf8')) : {};
    for (const m of modules) {
      if (m.state() === 'skipped') continue;
      known[durationKey(m.project.name, this.root, m.moduleId)] = Math.round(m.diagnostic().duration / 100) / 10;
    }
    const sorted = Object.fromEntries(Object.entries(known).sort(([a], [b]) => a.localeCompare(b)));
    writeFileSync(DURATIONS_FILE, `${JSON.stringify(sorted, null, 2)}\n`);
  }
}
