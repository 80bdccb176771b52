import type { TestProject } from 'vitest/node';
import { closeDb, openDb } from '../../src/db/client.js';
import { BUILD_ENV, buildSources, removeBuild } from './build.js';
import { makeTemplateDatabase, tagTestRun } from './pg.js';

// The suite's global setup (vitest.config.ts): the sources compiled for the servers, simulators and
// CLIs the tests start (test/support/build.ts); every PostgreSQL database a test creates carries
// this run's tag, and at the end of the run any still on the server fails the run (and is dropped),
// so a test that forgets to drop what it created cannot go unnoticed. The databases servers start on
// are copies of one migrated template made here (test/support/pg.ts).
export default async function setup(project: TestProject): Promise<(() => Promise<void>) | undefined> {
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
  // A migration added in watch mode needs no new template: a server applies what its copy lacks as it opens it.
  const dropTemplate = await makeTemplateDatabase(async (url) => closeDb(await openDb(url)));
  return async () => {
    for (const build of builds) removeBuild(build);
    await dropTemplate?.();
    const left = await leftovers();
    if (!left.length) return;
    console.error(`\n*** ${left.length} test database(s) were left behind by this run (now dropped): ${left.join(', ')} ***\n`);
    // A teardown's thrown error does not change vitest's exit code; this does.
    process.exitCode = 1;
  };
}
