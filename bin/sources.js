// Whether dist/ (scripts/build.js, run by `npm ci`) is the build of the sources as they are now.
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('..', import.meta.url));
export const DIST = join(ROOT, 'dist');
/** Written last by a build: the folder it was built for, the digest of what it was built from, and where in dist/ it is. */
export const BUILD_STAMP = 'stamp.json';
/** What a build is made from: the sources, the packages bundled with them, and the recipe. */
const INPUTS = ['src', 'package.json', 'package-lock.json', 'scripts/build.js'];

/** What a build of the project as it stands would be built from: a change to any input, or a move of the folder, makes another. */
export function sourcesOf(root = ROOT) {
  const hash = createHash('sha256');
  for (const input of INPUTS) digest(hash, root, input);
  return { root, sources: hash.digest('hex') };
}

function digest(hash, root, path) {
  for (const name of filesUnder(join(root, path), path)) {
    hash.update(name);
    hash.update('\0');
    hash.update(readFileSync(join(root, name)));
    hash.update('\0');
  }
}

/**
 * The files at `path` (itself, or those under it; none if it is missing), as paths from the root, in
 * a fixed order; walked as scripts/build.js walks a tree to compile it.
 */
function filesUnder(full, path) {
  if (!existsSync(full)) return [];
  if (!statSync(full).isDirectory()) return [path];
  return readdirSync(full, { withFileTypes: true })
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
    .flatMap((e) => (e.isDirectory() ? filesUnder(join(full, e.name), join(path, e.name)) : [join(path, e.name)]));
}

/**
 * The bundle of `regen` in dist/ when its stamp is that of the sources as they are, else null (no
 * build, one of other sources or of another folder, one no longer there): bin/regen.js then runs the
 * TypeScript through tsx, as a developer changing a file wants. REGEN_RUN_SOURCES=1 asks for the
 * sources whatever dist/ holds.
 */
export function builtEntry(root = ROOT, env = process.env) {
  if (env.REGEN_RUN_SOURCES === '1') return null;
  const stamp = readStamp(root);
  if (!stamp) return null;
  const now = sourcesOf(root);
  if (stamp.root !== now.root || stamp.sources !== now.sources || !/^[0-9a-f]+$/.test(stamp.build ?? '')) return null;
  const entry = join(root, 'dist', stamp.build, 'bundle', 'cli', 'main.js');
  // A stamp whose build is gone (removed by hand) is no build.
  return existsSync(entry) ? entry : null;
}

/** dist/stamp.json as the last build wrote it, or null when there is none to read. */
export function readStamp(root = ROOT) {
  try {
    return JSON.parse(readFileSync(join(root, 'dist', BUILD_STAMP), 'utf8'));
  } catch {
    return null;
  }
}
