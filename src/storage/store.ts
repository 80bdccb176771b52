import { randomBytes } from 'node:crypto';
import { Transform, type Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';

/** An object store rooted at a URI prefix; keys are relative to it and never contain `..`. */
export interface ObjectStore {
  /** The prefix URI, ending in `/`. */
  readonly uri: string;
  put(key: string, body: Buffer | string): Promise<void>;
  /** Streams a body of unknown length; returns the bytes written. */
  putStream(key: string, body: Readable): Promise<{ bytes: number }>;
  get(key: string): Promise<Buffer>;
  getStream(key: string): Promise<Readable>;
  head(key: string): Promise<{ bytes: number } | null>;
  delete(key: string): Promise<void>;
  /** Throws when the store cannot be reached or written: writes a probe object and deletes it, and removes the folders it made. */
  check(): Promise<void>;
  /**
   * As check(), for a run taking the prefix: the folders the probe made stay, so that no link can
   * later be put where the run's folder is and lead a second run into it.
   */
  take(): Promise<TakenLocation>;
  /** The key of an object under the prefix that begins with `start` (a name, or a folder ending in `/`), or null when there is none. */
  findKey(start: string): Promise<string | null>;
  /**
   * Removes what writes cut short by a crash left behind, last touched before `before` (epoch ms);
   * returns how many. With `dropEmpty`, the temp folder goes too once empty: for a run that has ended.
   */
  sweep(before: number, dropEmpty?: boolean): Promise<number>;
  /** Removes the temp folder and all it holds: the run writing through it has ended. */
  removeTemp(): Promise<void>;
}

/** A prefix a new run has taken (ObjectStore.take). */
export interface TakenLocation {
  /**
   * A local folder's identity ("device:inode", folderIdentity) as it stands, made again if a racing
   * create's give-back removed it meanwhile; null on S3. Throws FolderChangedError when another
   * folder stands in its place. Called where creates take turns, so that the folder a run records is there.
   */
  confirm(): Promise<string | null>;
  /**
   * Removes the empty folders the probe made (and any made inside them meanwhile), deepest first,
   * but none that `owned` says a run has: the run was not made after all. Called where creates take turns.
   */
  giveBack(owned: (folderUri: string) => Promise<boolean>): Promise<void>;
}

/**
 * A write refused because a run's local folder is no longer the one it took: moved, removed, or a
 * link to another folder put in its place. Its code names it in describeStoreError.
 */
export class FolderChangedError extends Error {
  readonly code = 'output_folder_changed';
  constructor() {
    super('the output folder is no longer the one the run took');
  }
}

/** A key for a probe object, unique so that checks from several processes never meet. */
export const probeKey = (): string => `.regen-probe-${randomBytes(6).toString('hex')}`;

export type StoreLocation = { kind: 'file'; dir: string } | { kind: 's3'; bucket: string; prefix: string };

export class StoreUriError extends Error {}

/** Parses `s3://bucket/prefix/` or `file:///abs/path/`; rejects traversal and anything else. */
export function parseStoreUri(uri: string): StoreLocation {
  if (uri.includes('\0')) throw new StoreUriError('URI contains a NUL byte');
  const m = /^s3:\/\/([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])\/(.*)$/.exec(uri);
  if (m) {
    const prefix = m[2];
    if (prefix.split('/').some((seg) => seg === '..' || seg === '.')) throw new StoreUriError('URI must not contain "." or ".." segments');
    return { kind: 's3', bucket: m[1], prefix };
  }
  if (uri.startsWith('file:///')) {
    // A "." segment names the same folder and is collapsed; ".." could climb out of a root.
    if (/(^|\/)(\.\.|%2e%2e|%2e\.|\.%2e)(\/|$)/i.test(uri.slice('file://'.length))) {
      throw new StoreUriError('URI must not contain ".." segments');
    }
    return { kind: 'file', dir: fileURLToPath(uri) };
  }
  throw new StoreUriError('expected s3://bucket/prefix/ or file:///absolute/path/');
}

export function assertKey(key: string): void {
  if (!key || key.startsWith('/') || key.includes('\0') || key.split('/').some((s) => s === '..' || s === '.' || s === '')) {
    throw new Error(`invalid object key`);
  }
}

/** A pass-through that counts what flows through it; attached lazily, so no data is read early. */
export function byteCounter(): Transform & { bytes: number } {
  const t = new Transform({
    transform(chunk: Buffer, _enc, done) {
      t.bytes += chunk.length;
      done(null, chunk);
    },
  }) as Transform & { bytes: number };
  t.bytes = 0;
  return t;
}

const CAUSES: Record<string, string> = {
  ECONNREFUSED: 'connection refused',
  ECONNRESET: 'connection reset',
  ETIMEDOUT: 'timed out',
  TimeoutError: 'timed out',
  ENOTFOUND: 'host not found',
  EAI_AGAIN: 'host not found',
  ENOTDIR: 'not a directory',
  EEXIST: 'a file is in the way',
  EACCES: 'permission denied',
  EPERM: 'permission denied',
  EROFS: 'read-only file system',
  ENOSPC: 'no space left',
  EDQUOT: 'disk quota exceeded',
  ENOENT: 'no such file or folder',
  output_folder_changed: 'the output folder is no longer the one the run took (moved, removed, or a link put in its place)',
};

/**
 * Why a store operation failed, in words an operator can act on, without the message itself:
 * a file system error's message carries the server's path, an SDK's may carry a signed URL.
 */
export function describeStoreError(err: unknown): string {
  const e = err as { code?: unknown; name?: unknown; errors?: unknown[]; $metadata?: { httpStatusCode?: number } };
  // A refused connection to a host with several addresses arrives as an AggregateError.
  const code =
    typeof e?.code === 'string' ? e.code : typeof (e?.errors?.[0] as { code?: unknown })?.code === 'string' ? (e.errors![0] as { code: string }).code : null;
  if (code) return CAUSES[code] ? `${CAUSES[code]} (${code})` : code;
  const status = e?.$metadata?.httpStatusCode;
  const name = typeof e?.name === 'string' && e.name !== 'Error' ? e.name : null;
  if (name && status) return `${name} (HTTP ${status})`;
  if (name) return CAUSES[name] ?? name;
  return 'unknown storage error';
}

export function joinUri(base: string, key: string): string {
  return base.endsWith('/') ? base + key : `${base}/${key}`;
}
