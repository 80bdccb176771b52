import { realpathSync } from 'node:fs';
import { basename, dirname, join, resolve, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

/**
 * The folder inside a file store's folder where it writes objects before moving them into place
 * (FileStore): a dot name, so a reader globbing `shard-*` sees only whole objects, and within the
 * folder, so the atomic rename never crosses a file system.
 */
export const TEMP_FOLDER = '.regen-tmp';

/** A URI with its scheme in lower case: schemes are case-insensitive (RFC 3986 §3.1), and `FILE:///x` names what `file:///x` does. */
export const lowerScheme = (uri: string): string => uri.replace(/^[A-Za-z][A-Za-z0-9+.-]*:/, (scheme) => scheme.toLowerCase());

/** Whether a path is a root or lies below it. */
export function inside(path: string, root: string): boolean {
  return path === root || path.startsWith(root.endsWith(sep) ? root : root + sep);
}

/**
 * A path with `//` and `.` collapsed and the symlinks of its existing part resolved: the folder it
 * names on disk, however it was spelled. The part that does not exist yet is kept as written.
 */
export function realLocation(path: string): string {
  const rest: string[] = [];
  let at = resolve(path);
  for (;;) {
    try {
      return join(realpathSync(at), ...rest.reverse());
    } catch {
      const up = dirname(at);
      if (up === at) return join(at, ...rest.reverse());
      rest.push(basename(at));
      at = up;
    }
  }
}

/** A `file://` folder URI (percent-encoding decoded, then re-encoded one way) for where it points on disk, ending in `/`. */
export function canonicalFileUri(uri: string): string {
  const href = pathToFileURL(realLocation(fileURLToPath(uri))).href;
  return href.endsWith('/') ? href : href + '/';
}

/** The URI of a local folder, in the same canonical form. */
export const folderUri = (path: string): string => canonicalFileUri(pathToFileURL(resolve(path)).href);

/** Whether one prefix holds the other (or they are the same): two such outputs would write into each other. */
export const overlaps = (a: string, b: string): boolean => a.startsWith(b) || b.startsWith(a);
