// Compiles the sources for `regen` to run without tsx's loader: `npm ci` runs it (the `prepare`
// script) into dist/, which bin/regen.js runs while it matches the sources (bin/sources.js); the
// test suite compiles its own tree per run the same way (test/support/build.ts).
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { buildSync, transformSync } from 'esbuild';
import { BUILD_STAMP, DIST, readStamp, ROOT, sourcesOf } from '../bin/sources.js';

/** The entry points bundled with their packages, and the bundle's name for each: `regen` (serve and the CLI) and the runner thread. */
export const BUNDLED = { 'src/cli/main.ts': 'cli/main', 'src/runner/worker.ts': 'runner/worker' };

/** How esbuild bundles the entry points (test/layout.test.ts reads what the runner thread's bundle loads at start with the same). */
export const BUNDLE_OPTIONS = {
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
};

/**
 * Compiles each tree (src/ and any others given, paths from the project's root) file by file into
 * `out`, with the esbuild tsx itself compiles with (names kept, as tsx keeps them; no source maps: a
 * stack trace points into the compiled file), and bundles the entry points above with their
 * packages (all but the native ones) into `out/bundle/`. A server that found, read and compiled
 * some 600 modules one by one took 2.1–2.2 s of CPU to listen with its runner thread up (most of it
 * in Node's module loader, not in the modules' code); bundled, 1.4 s; through tsx's loader, 1–2 s
 * more. Each module keeps its place: import.meta.url is written into each file of src/ as its own
 * URL, so what a module finds beside itself (the migrations, the dashboard, the runner thread's
 * entry) it finds in a bundle too: the URL of its place under `home`, where the tree will live.
 */
export function compileSources(out, trees = ['src'], home = out) {
  for (const tree of trees) compileTree(join(ROOT, tree), join(out, tree), tree === 'src' ? join(home, tree) : null);
  // Paths the sources resolve from their own place: ../../migrations (the stores), src/dashboard (copied above).
  symlinkSync(join(ROOT, 'migrations'), join(out, 'migrations'));
  buildSync({
    ...BUNDLE_OPTIONS,
    entryPoints: Object.fromEntries(Object.entries(BUNDLED).map(([source, name]) => [name, join(out, source.replace(/\.ts$/, '.js'))])),
    outdir: join(out, 'bundle'),
  });
  // The runner thread's entry registers tsx to load worker.ts; here it loads the worker's bundle.
  writeFileSync(join(out, 'src', 'runner', 'worker-boot.mjs'), "await import('../../bundle/runner/worker.js');\n");
}

/** `home`: where `to` will live, for the URLs written in; null to leave import.meta.url as it is. */
function compileTree(from, to, home) {
  mkdirSync(to, { recursive: true });
  for (const entry of readdirSync(from, { withFileTypes: true })) {
    const source = join(from, entry.name);
    if (entry.isDirectory()) {
      compileTree(source, join(to, entry.name), home && join(home, entry.name));
    } else if (entry.name.endsWith('.d.ts')) {
    } else if (entry.name.endsWith('.ts')) {
      const { code } = transformSync(readFileSync(source, 'utf8'), {
        loader: 'ts',
        format: 'esm',
        target: 'node20',
        keepNames: true,
        sourcefile: relative(ROOT, source),
      });
      const name = entry.name.replace(/\.ts$/, '.js');
      // In src/ (bundled), where it is only ever code: the module's own URL, as Node gives it
      // there, written in; the same value loaded file by file, and still its own in a bundle.
      const url = home && JSON.stringify(pathToFileURL(join(home, name)).href);
      writeFileSync(join(to, name), url ? code.replaceAll('import.meta.url', () => url) : code);
    } else {
      copyFileSync(source, join(to, entry.name));
    }
  }
}

/** Marks a folder or file of dist/ on its way in or out, and the process it belongs to. */
const TEMP = '.tmp-';

/**
 * A build in dist/ of its own, named by what it was built from, and dist/stamp.json (read by
 * bin/regen.js) naming it, written last. A build's folder is whole or absent: it appears by a
 * rename, and goes by one. A build cut short leaves the stamp before, which no longer matches the
 * sources, so bin/regen.js runs them. The sources are read for the stamp before they are compiled:
 * one changed meanwhile leaves a stamp that does not match them, never a build that passes for
 * them. The build before stays, for a server still running it (its modules loaded on first use,
 * such as the AWS SDK's and the runner's Parquet writer, and a restarted runner thread); older ones go.
 */
export function buildDist() {
  const stamp = sourcesOf();
  const build = createHash('sha256').update(JSON.stringify(stamp)).digest('hex').slice(0, 16);
  const home = join(DIST, build);
  mkdirSync(DIST, { recursive: true });
  // The same inputs built before (npm ci run again): that build is this one.
  if (!existsSync(home)) {
    const partial = `${home}${TEMP}${process.pid}`;
    rmSync(partial, { recursive: true, force: true });
    mkdirSync(partial);
    compileSources(partial, ['src'], home);
    try {
      renameSync(partial, home);
    } catch (err) {
      // Another build of the same inputs got there first.
      rmSync(partial, { recursive: true, force: true });
      if (!existsSync(home)) throw err;
    }
  }
  // The build the stamp names now, whatever its sources.
  const before = readStamp()?.build;
  // Already the build in use (npm ci run again): nothing changes, and the build before stays.
  if (before === build) return home;
  const stampFile = join(DIST, BUILD_STAMP);
  writeFileSync(`${stampFile}${TEMP}${process.pid}`, `${JSON.stringify({ ...stamp, build })}\n`);
  renameSync(`${stampFile}${TEMP}${process.pid}`, stampFile);
  for (const name of readdirSync(DIST)) {
    if (name === build || name === before || name === BUILD_STAMP) continue;
    const owner = Number(name.split(TEMP)[1]);
    if (owner) {
      // Another build's, under way, or left by one that died.
      if (!pidAlive(owner)) rmSync(join(DIST, name), { recursive: true, force: true });
      continue;
    }
    const gone = join(DIST, `${name}.gone${TEMP}${process.pid}`);
    try {
      renameSync(join(DIST, name), gone);
    } catch (err) {
      // Another build removed it meanwhile.
      if (err.code === 'ENOENT') continue;
      throw err;
    }
    rmSync(gone, { recursive: true, force: true });
  }
  return home;
}

/** Whether a process of this machine is alive: the owner of a build under way. */
export function pidAlive(pid) {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return err.code === 'EPERM';
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === realpathSync(process.argv[1])) {
  const started = Date.now();
  const home = buildDist();
  console.log(`regen: compiled src/ into ${relative(ROOT, home)}/ in ${Date.now() - started} ms`);
}
