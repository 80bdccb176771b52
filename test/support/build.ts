import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync, copyFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { buildSync, transformSync } from 'esbuild';

/**
 * The sources compiled once per test run, file by file, by the esbuild tsx itself compiles with
 * (names kept, as tsx keeps them; no source maps: a stack trace points into the compiled file):
 * the servers, simulators and CLIs the tests start load JavaScript, not TypeScript through tsx's
 * loader, which took each of them 1–2 s of CPU before it listened (README, Development).
 *
 * The tree lives under node_modules/.cache so vitest loads it as Node does (it transforms only
 * files outside node_modules), and its packages resolve from the project's node_modules.
 */

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const BUILDS = join(ROOT, 'node_modules', '.cache', 'regen-test-build');
/** Set by the suite's global setup for every test file and every process a test starts. */
export const BUILD_ENV = 'REGEN_TEST_BUILD';

/**
 * Compiles src/, bench/ and test/support/ (the bench's servers come from there) into a fresh folder
 * of its own and returns it; folders of runs no longer alive are removed.
 */
export function buildSources(): string {
  mkdirSync(BUILDS, { recursive: true });
  for (const name of readdirSync(BUILDS)) {
    const pid = Number(name.split('-')[0]);
    if (!pidAlive(pid)) rmSync(join(BUILDS, name), { recursive: true, force: true });
  }
  const out = join(BUILDS, `${process.pid}-${Date.now()}`);
  for (const tree of ['src', 'bench', 'test/support']) compileTree(join(ROOT, tree), join(out, tree), tree === 'src');
  // Paths the sources resolve from their own place: ../../migrations (the stores), src/dashboard (copied above).
  symlinkSync(join(ROOT, 'migrations'), join(out, 'migrations'));
  bundleEntries(out);
  // The runner thread's entry registers tsx to load worker.ts; here it loads the worker's bundle.
  writeFileSync(join(out, 'src', 'runner', 'worker-boot.mjs'), "await import('../../bundle/runner/worker.js');\n");
  return out;
}

/** The processes the tests start most, and what each starts: `regen` (serve, and the CLI) and the runner thread. */
const BUNDLED: Record<string, string> = { 'src/cli/main.ts': 'cli/main', 'src/runner/worker.ts': 'runner/worker' };

/**
 * The compiled tree's busiest entry points bundled with their packages (all but the native ones)
 * into `bundle/`: a server that found, read and compiled some 600 modules one by one took 2.1–2.2 s of
 * CPU to listen with its runner thread up (most of it in Node's module loader, not in the modules'
 * code); bundled, 1.4 s. The modules are the compiled tree's own, and each keeps its place:
 * import.meta.url was written into each file as its own URL (compileTree), so what a module finds
 * beside itself (the migrations, the dashboard, the runner thread's entry) it finds in a bundle too.
 */
function bundleEntries(out: string): void {
  buildSync({
    entryPoints: Object.fromEntries(Object.entries(BUNDLED).map(([source, name]) => [name, join(out, source.replace(/\.ts$/, '.js'))])),
    outdir: join(out, 'bundle'),
    bundle: true,
    splitting: true,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    // As the compiled tree and tsx keep them: a class's name is what an error's name and a log say.
    keepNames: true,
    external: ['better-sqlite3', 'pg-native'],
    // Packages written as CommonJS call require(), which an ES module has not got.
    banner: { js: "import { createRequire as __regenRequire } from 'node:module'; const require = __regenRequire(import.meta.url);" },
    logLevel: 'error',
  });
}

function compileTree(from: string, to: string, ownUrls: boolean): void {
  mkdirSync(to, { recursive: true });
  for (const entry of readdirSync(from, { withFileTypes: true })) {
    const source = join(from, entry.name);
    if (entry.isDirectory()) {
      compileTree(source, join(to, entry.name), ownUrls);
    } else if (entry.name.endsWith('.d.ts')) {
    } else if (entry.name.endsWith('.ts')) {
      const { code } = transformSync(readFileSync(source, 'utf8'), {
        loader: 'ts',
        format: 'esm',
        target: 'node20',
        keepNames: true,
        sourcefile: relative(ROOT, source),
      });
      const target = join(to, entry.name.replace(/\.ts$/, '.js'));
      // In src/ (bundled below), where it is only ever code: the module's own URL, as Node gives it
      // here, written in; the same value loaded file by file, and still its own in a bundle.
      writeFileSync(target, ownUrls ? code.replaceAll('import.meta.url', () => JSON.stringify(pathToFileURL(target).href)) : code);
    } else {
      copyFileSync(source, join(to, entry.name));
    }
  }
}

/** Whether a process of this machine is alive: the owner of a build, or of a test template database (test/support/pg.ts). */
export function pidAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

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

/** The arguments that make `node` run a source entry point: its bundle or compiled form, or the TypeScript through tsx. */
export function nodeEntry(sourcePath: string): string[] {
  const tree = compiledTree();
  if (!tree) return ['--import', 'tsx', located(sourcePath)];
  return [sourcePath in BUNDLED ? join(tree, 'bundle', `${BUNDLED[sourcePath]}.js`) : located(sourcePath)];
}

/** For the teardown: the tree goes with its run. */
export function removeBuild(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}
