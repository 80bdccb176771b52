import type { TestProject } from 'vitest/node';
import { BUILD_ENV, buildSources, removeBuild } from './build.js';
import { tagTestRun } from './pg.js';

// The suite's global setup (vitest.config.ts): the sources compiled for the servers, simulators and
// CLIs the tests start (test/support/build.ts); every PostgreSQL database a test creates carries
// this run's tag, and at the end of the run any still on the server fails the run (and is dropped),
// so a test that forgets to drop what it created cannot go unnoticed.
export default function setup(project: TestProject): (() => Promise<void>) | undefined {
  // Each project inherits this setup (vitest.config.ts, extends: true): it does its work once, for the root.
  if (!project.isRootProject()) return undefined;
  const builds = [buildSources()];
  process.env[BUILD_ENV] = builds[0];
  // Watch mode reruns the tests without setting up again: each rerun gets the sources as they are then.
  project.onTestsRerun(() => {
    builds.push(buildSources());
    process.env[BUILD_ENV] = builds.at(-1);
  });
  const leftovers = tagTestRun();
  return async () => {
    for (const build of builds) removeBuild(build);
    const left = await leftovers();
    if (!left.length) return;
    console.error(`\n*** ${left.length} test database(s) were left behind by this run (now dropped): ${left.join(', ')} ***\n`);
    // A teardown's thrown error does not change vitest's exit code; this does.
    process.exitCode = 1;
  };
}
