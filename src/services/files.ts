import { Transform, type Readable } from 'node:stream';
import type { Deps } from '../deps.js';
import { deleteFile, getFile, insertFile, setFileExpiry, setFilePurpose } from '../db/files.js';
import { expiryProblem, outputExpiresAt } from '../domain/expiry.js';
import { getRunValidatingFile } from '../db/runs.js';
import type { FileRow } from '../db/schema.js';
import { FILE_PURPOSES } from '../domain/files.js';
import { ApiError, notFound } from '../errors.js';
import { newId } from '../ids.js';
import { batchFileStream, resolveBatchFile } from './batches/files.js';

// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters in a file name are replaced
const cleanName = (name: string) => name.replace(/[\\/\0-\x1f]/g, '_').slice(0, 255) || 'upload.jsonl';

/** gzip's magic number (RFC 1952, section 2.3.1): the first two bytes of every gzip stream. */
const GZIP_MAGIC = [0x1f, 0x8b];

/**
 * Passes an upload through, failing at its first bytes when they are gzip's: a compressed file
 * would otherwise be stored whole and fail validation later as "not valid UTF-8".
 */
function refuseCompressed(): Transform {
  let head = Buffer.alloc(0);
  return new Transform({
    transform(chunk: Buffer, _enc, done) {
      if (head.length < GZIP_MAGIC.length) {
        head = Buffer.concat([head, chunk]).subarray(0, GZIP_MAGIC.length);
        if (head.length === GZIP_MAGIC.length && GZIP_MAGIC.every((b, i) => head[i] === b)) {
          done(new ApiError('invalid_request', 'file: gzip-compressed uploads are not accepted; send the JSONL uncompressed', { field: 'file' }));
          return;
        }
      }
      done(null, chunk);
    },
  });
}

/** Streams an upload into the object store and records it. */
export async function storeFile(deps: Deps, filename: string, purpose: string, body: Readable): Promise<FileRow> {
  const id = newId('file');
  const key = `files/${id}.jsonl`;
  const checked = refuseCompressed();
  // A body that fails is the client's doing (it hung up mid-upload), not the store's.
  let cut = false;
  body.on('error', (err) => {
    cut = true;
    checked.destroy(err);
  });
  // A refused body is still read to its end, so that a multipart parser behind it can finish.
  checked.on('error', () => {
    body.unpipe(checked);
    body.resume();
  });
  let bytes: number;
  try {
    ({ bytes } = await deps.stores.forUri(deps.config.outputUri).putStream(key, body.pipe(checked)));
  } catch (err) {
    if (err instanceof ApiError) throw err;
    if (cut) {
      deps.logger.info({ file_id: id }, 'upload cut off by the client; nothing kept');
      throw new ApiError('invalid_request', 'the upload ended before its body did', { field: 'file' });
    }
    deps.logger.error({ err: { message: (err as Error).message } }, 'file upload to object storage failed');
    throw new ApiError('storage_unavailable', 'the object store could not take the file; try again');
  }
  const row = { id, filename: cleanName(filename), purpose, bytes, objectKey: key, createdAt: deps.clock(), expiresAt: null, expiredAt: null };
  await insertFile(deps.db, row);
  return row;
}

/** Drops a stored upload that the request turned out not to want. */
export async function discardFile(deps: Deps, row: Pick<FileRow, 'id' | 'objectKey'>): Promise<void> {
  await deps.stores
    .forUri(deps.config.outputUri)
    .delete(row.objectKey)
    .catch(() => {});
  await deleteFile(deps.db, row.id);
}

/**
 * Keeps a stored upload, with the purpose given after it (a multipart field may follow the file);
 * an empty file or an unknown purpose is refused and the upload dropped.
 */
export async function keepFile(deps: Deps, row: FileRow, purpose?: string, expiry: FileExpiry = {}): Promise<FileRow> {
  if (row.bytes === 0) {
    await discardFile(deps, row);
    throw new ApiError('invalid_request', 'the file is empty', { field: 'file' });
  }
  let expiresAt: number | null;
  try {
    expiresAt = expiryOf(deps, row.createdAt, expiry);
  } catch (err) {
    await discardFile(deps, row);
    throw err;
  }
  if (expiresAt !== null) {
    await setFileExpiry(deps.db, row.id, expiresAt);
    row = { ...row, expiresAt };
  }
  if (purpose === undefined) return row;
  if (!(FILE_PURPOSES as readonly string[]).includes(purpose)) {
    await discardFile(deps, row);
    throw new ApiError('validation_failed', `purpose: expected one of ${FILE_PURPOSES.join(', ')}`, { field: 'purpose' });
  }
  await setFilePurpose(deps.db, row.id, purpose);
  return { ...row, purpose };
}

/** `expires_after` as an upload gives it: form fields (or query parameters) `expires_after[anchor]` and `expires_after[seconds]`. */
export interface FileExpiry {
  anchor?: string;
  seconds?: string;
}

/** When the file's content goes (its creation, OpenAI's only anchor, plus the seconds), or null when it is kept. */
function expiryOf(deps: Deps, createdAt: number, e: FileExpiry): number | null {
  if (e.anchor === undefined && e.seconds === undefined) return null;
  if (e.anchor !== 'created_at') throw new ApiError('validation_failed', 'expires_after.anchor: expected "created_at"', { field: 'expires_after.anchor' });
  const seconds = /^\d{1,10}$/.test(e.seconds ?? '') ? Number(e.seconds) : Number.NaN;
  const problem = expiryProblem(seconds, deps.config.minExpirySeconds);
  if (problem) throw new ApiError('validation_failed', `expires_after.seconds: ${problem}`, { field: 'expires_after.seconds' });
  return createdAt + seconds * 1000;
}

/** Deletes a file that no run is still validating; a batch's output and error files go with their run. */
export async function removeFile(deps: Deps, id: string): Promise<void> {
  const file = await getFile(deps.db, id);
  if (!file && (await resolveBatchFile(deps.db, id)))
    throw new ApiError('conflict', "a batch's output and error files are views of its run's shards and go with the run");
  if (!file) throw notFound('file', id);
  const reader = await getRunValidatingFile(deps.db, id);
  if (reader) throw new ApiError('conflict', `run ${reader.id} is still validating this file`);
  await deps.stores
    .forUri(deps.config.outputUri)
    .delete(file.objectKey)
    .catch((err: Error) => {
      deps.logger.warn({ file_id: id, err: { message: err.message } }, 'file object delete failed; row removed anyway');
    });
  await deleteFile(deps.db, id);
}

const expired = (id: string, at: number) =>
  new ApiError('not_found', `file ${JSON.stringify(id)} expired at ${new Date(at).toISOString()}: its content was deleted`);

/** A file's bytes as a stream, with their count when it is known before reading. */
export async function fileContent(deps: Deps, id: string): Promise<{ stream: Readable; bytes: number | null }> {
  const file = await getFile(deps.db, id);
  if (!file) {
    // A batch's output and error files are made from its shards as they are sent.
    const batchFile = await resolveBatchFile(deps.db, id);
    if (!batchFile) throw notFound('file', id);
    if (batchFile.run.outputExpiredAt !== null) throw expired(id, outputExpiresAt(batchFile.run) ?? batchFile.run.outputExpiredAt);
    const stream = batchFileStream(deps, batchFile.run, batchFile.kind).on('error', (err) => {
      deps.logger.error({ file_id: id, err: { message: err.message } }, 'batch file read failed');
    });
    return { stream, bytes: null };
  }
  if (file.expiredAt !== null) throw expired(id, file.expiresAt ?? file.expiredAt);
  try {
    return { stream: await deps.stores.forUri(deps.config.outputUri).getStream(file.objectKey), bytes: file.bytes };
  } catch (err) {
    deps.logger.error({ file_id: id, err: { message: (err as Error).message } }, 'file content read failed');
    throw new ApiError('storage_unavailable', 'the object store could not return the file; try again');
  }
}
