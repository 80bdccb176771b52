import { realpathSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { Config } from '../../config.js';
import { ApiError } from '../../errors.js';
import { parseStoreUri, StoreUriError } from '../../storage/index.js';
import { inside } from '../../storage/location.js';
import { isOwnFile } from './output-location.js';

type InputSource = { kind: 'path'; path: string } | { kind: 'object'; prefixUri: string; key: string };

const OWN_FILE = "regen's own database and uploaded files are not an input; use input.file_id for an uploaded file";

const bad = (message: string) => new ApiError('validation_failed', `input.uri: ${message}`, { field: 'input.uri' });

/**
 * Checks an input URI and says where to read it: s3:// anywhere the credentials reach, file:// only
 * inside the data folder or REGEN_INPUT_ROOTS (symlinks resolved first, so none can lead outside).
 */
export function resolveInput(uri: string, config: Pick<Config, 'dataDir' | 'inputRoots' | 'dbPath' | 'outputUri'>): InputSource {
  if (uri.startsWith('s3://')) {
    let loc: ReturnType<typeof parseStoreUri>;
    try {
      loc = parseStoreUri(uri);
    } catch (err) {
      throw bad(err instanceof StoreUriError ? err.message : 'not a valid s3:// URI');
    }
    if (loc.kind !== 's3' || !loc.prefix || loc.prefix.endsWith('/')) throw bad('expected s3://bucket/key.jsonl');
    // An uploaded file is read through input.file_id, as a local one is (isOwnFile).
    const store = parseStoreUri(config.outputUri);
    if (store.kind === 's3' && store.bucket === loc.bucket && loc.prefix.startsWith(`${store.prefix}files/`)) throw bad(OWN_FILE);
    return { kind: 'object', prefixUri: `s3://${loc.bucket}/`, key: loc.prefix };
  }
  if (!uri.startsWith('file:///')) throw bad('expected s3://bucket/key.jsonl or file:///path/inside/an/input/root.jsonl');
  let path: string;
  try {
    path = realpathSync(fileURLToPath(uri));
  } catch {
    throw bad('no readable file at that URI inside the allowed input roots');
  }
  const roots = [config.dataDir, ...config.inputRoots].map((r) => {
    try {
      return realpathSync(r);
    } catch {
      return r;
    }
  });
  if (!roots.some((root) => inside(path, root))) {
    throw bad('file:// inputs must lie inside the data folder or REGEN_INPUT_ROOTS');
  }
  // Before anything is read: the database holds endpoint keys, and a bad line would be quoted back.
  if (isOwnFile(path, config)) throw bad(OWN_FILE);
  if (!statSync(path).isFile()) throw bad('no readable file at that URI inside the allowed input roots');
  return { kind: 'path', path };
}
