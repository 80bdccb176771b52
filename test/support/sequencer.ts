import { existsSync, readFileSync } from 'node:fs';
import { relative } from 'node:path';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/** Seconds each file took in a past full run, per project (`project:path`): test/durations.json, written by `npm run test:durations`. */
export const DURATIONS_FILE = new URL('../durations.json', import.meta.url);

export const durationKey = (project: string, root: string, moduleId: string) => `${project}:${relative(root, moduleId)}`;

/**
 * Starts the longest files first, whatever their project: with two workers, a three-minute file
 * started last would run alone for minutes at the end of the suite. Files the list does not know
 * (new ones) go first of all, as vitest's own sequencer does with files it has no results for.
 * A fresh clone has no vitest cache, so the order comes from the checked-in list.
 */
export class LongestFirst extends BaseSequencer {
  async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const known: Record<string, number> = existsSync(DURATIONS_FILE) ? JSON.parse(readFileSync(DURATIONS_FILE, 'utf8')) : {};
    const root = this.ctx.config.root;
    const seconds = (spec: TestSpecification) => known[durationKey(spec.project.name, root, spec.moduleId)] ?? Number.POSITIVE_INFINITY;
    return [...files].sort(
      (a, b) => seconds(b) - seconds(a) || durationKey(a.project.name, root, a.moduleId).localeCompare(durationKey(b.project.name, root, b.moduleId)),
    );
  }
}
