import { existsSync, readFileSync } from 'node:fs';
import { relative } from 'node:path';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/** Seconds each file took in a past full run, per project (`project:path`): test/durations.json, written by `npm run test:durations`. */
export const DURATIONS_FILE = new URL('../durations.json', import.meta.url);

export const durationKey = (project: string, root: string, moduleId: string) => `${project}:${relative(root, moduleId)}`;

/** Files shorter than this run after the long ones, one project's after the other's (below). */
const SHORT_S = 15;

/**
 * Run after every other file: the bench's smoke run keeps three bench processes going at once, each
 * with its servers and simulators, which fill both cores on their own. Run first (it is among the
 * longest), it loaded the machine most while the timing tests queued after it measured a pace,
 * and its end changed that pace under them (the likeliest reading of a full run where a
 * conversation ETA read at a third of the run was +124% of the time left). Last, it fills the
 * cores the suite's last short files leave.
 */
const LAST = new Set(['test/bench.test.ts']);

/**
 * Starts the longest files first, whatever their project: with a few workers, a three-minute file
 * started last would run alone for minutes at the end of the suite. Files the list does not know
 * (new ones) go first of all, as vitest's own sequencer does with files it has no results for.
 * The short files follow grouped by project, longest first within each (then the LAST ones): a
 * worker goes on to the next file in the same process only when the next file queued is of its own
 * project (vitest.config.ts, isolate), and for a file of a few seconds a new process is a good part
 * of its cost.
 * Grouping the long files by project too was tried and looked worse (one run each side, the other
 * side with a second change in it): 13 worker processes instead of 35 and 66 s importing instead
 * of 109, but the PostgreSQL project's files, three at once, took 17% longer (1,910 against 1,635 s
 * summed) and the suite 1,367 s against 1,305 (BENCHMARKS.md, 2026-12-07, third session).
 * A fresh clone has no vitest cache, so the order comes from the checked-in list.
 */
export class LongestFirst extends BaseSequencer {
  async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const known: Record<string, number> = existsSync(DURATIONS_FILE) ? JSON.parse(readFileSync(DURATIONS_FILE, 'utf8')) : {};
    const root = this.ctx.config.root;
    const key = (spec: TestSpecification) => durationKey(spec.project.name, root, spec.moduleId);
    const seconds = (spec: TestSpecification) => known[key(spec)] ?? Number.POSITIVE_INFINITY;
    const last = (spec: TestSpecification) => (LAST.has(relative(root, spec.moduleId)) ? 1 : 0);
    const group = (spec: TestSpecification) => (seconds(spec) >= SHORT_S ? '' : spec.project.name);
    return [...files].sort((a, b) => last(a) - last(b) || group(a).localeCompare(group(b)) || seconds(b) - seconds(a) || key(a).localeCompare(key(b)));
  }
}
