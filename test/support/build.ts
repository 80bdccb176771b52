import { existsSync, mkdirSync, readdirSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { BUNDLED, compileSources, pidAlive } from '../../scripts/build.js';

/**
 * The sources compiled once per test run, as `npm ci` compiles dist/ (scripts/build.js), with bench/
 * and test/support/ beside them (the bench's servers come from there): the servers, simulators and
 * CLIs the tests start load JavaScript, not TypeScript through tsx's loader, which took each of them
 * 1–2 s of CPU before it listened (README, Development). A tree of its own each run, not dist/: the
 * suite tests the sources as they are, and runs beside other suites of the same checkout.
 *
 * The tree lives under node_modules/.cache so vitest loads it as Node does (it transforms only
 * files outside node_modules), and its packages resolve from the project's node_modules.
 */

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const BUILDS = join(ROOT, 'node_modules', '.cache', 'regen-test-build');
/** Set by the suite's global setup for every test file and every process a test starts. */
export const BUILD_ENV = 'REGEN_TEST_BUILD';

/** Compiles the trees into a fresh folder of its own and returns it; folders of runs no longer alive are removed. */
export function buildSources(): string {
  mkdirSync(BUILDS, { recursive: true });
  for (const name of readdirSync(BUILDS)) {
    const pid = Number(name.split('-')[0]);
    if (!pidAlive(pid)) rmSync(join(BUILDS, name), { recursive: true, force: true });
  }
  const out = join(BUILDS, `${process.pid}-${Date.now()}`);
  compileSources(out, ['src', 'bench', 'test/support']);
  // What test/support/build.js imports from beside itself: the recipe, plain JavaScript.
  symlinkSync(join(ROOT, 'scripts'), join(out, 'scripts'));
  return out;
}

/** Whether a process of this machine is alive: the owner of a build, or of a test template database (test/support/pg.ts). */
export { pidAlive };

/** This run's compiled tree, or null outside the suite (`npm run bench` runs the sources through tsx). */
export function compiledTree(): string | null {
  const dir = process.env[BUILD_ENV];
  return dir && existsSync(dir) && statSync(dir).isDirectory() ? dir : null;
}

/** Where a source file is loaded from: its compiled form in this run's tree, else the file itself. */
function located(sourcePath: string): string {
  const tree = compiledTree();
  return tree ? join(tree, sourcePath.replace(/\.ts$/, '.js')) : join(ROOT, sourcePath);
}

/** Imports a source module (a path from the project's root): compiled in the suite, else through tsx. */
export function loadSource<T>(sourcePath: string): Promise<T> {
  return import(pathToFileURL(located(sourcePath)).href) as Promise<T>;
}

/** The arguments that make `node` run a source entry point: its bundle or compiled form in the suite, else as `npm run bench` runs it. */
export function nodeEntry(sourcePath: string): string[] {
  const tree = compiledTree();
  // `regen` as users run it (bin/regen.js: dist/ while it matches the sources, else tsx).
  if (!tree) return sourcePath === 'src/cli/main.ts' ? [join(ROOT, 'bin', 'regen.js')] : ['--import', 'tsx', located(sourcePath)];
  return [sourcePath in BUNDLED ? join(tree, 'bundle', `${BUNDLED[sourcePath as keyof typeof BUNDLED]}.js`) : located(sourcePath)];
}

/** For the teardown: the tree goes with its run. */
export function removeBuild(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}
