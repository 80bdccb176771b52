import { basename, dirname } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { Config } from '../../config.js';
import type { Deps } from '../../deps.js';
import { type DbOrTx, isUniqueViolation } from '../../db/client.js';
import { getRunOutputWithin, getRunOverlappingOutput, insertRun, listOutputUris, serializeOutputClaims, setOutputUri } from '../../db/runs.js';
import type { runs } from '../../db/schema.js';
import { type OutputFormat, writtenKeyStarts } from '../../domain/output-format.js';
import { isTerminalRun } from '../../domain/statuses.js';
import { ApiError } from '../../errors.js';
import { canonicalFileUri, folderUri, inside, lowerScheme, overlaps, realLocation, TEMP_FOLDER } from '../../storage/location.js';
import { describeStoreError, parseStoreUri, StoreUriError, type TakenLocation } from '../../storage/index.js';

/** An S3 object key is at most 1,024 bytes; the output prefix's unique index holds it whole. */
const MAX_OUTPUT_URI_BYTES = 1024;

const bad = (message: string) => new ApiError('validation_failed', `output.uri: ${message}`, { field: 'output.uri' });

/**
 * One spelling for each place: a `file://` prefix as the folder it names on disk (percent-encoding
 * decoded, `//` and `.` collapsed, symlinks resolved); an `s3://` prefix as written, since there
 * `a//b` and `a/b` are different keys.
 */
export function canonicalOutputUri(uri: string): string {
  return uri.startsWith('file:') ? canonicalFileUri(uri) : uri;
}

/** Where regen keeps its own data: uploaded files, and on disk the data folder with the database. */
function ownStore(config: Pick<Config, 'outputUri' | 'dataDir'>): { filesUri: string; dataUri: string } {
  return { filesUri: `${canonicalOutputUri(config.outputUri)}files/`, dataUri: folderUri(config.dataDir) };
}

/** Whether a local path is one of regen's own files: the database (and its journal), or an uploaded file. */
export function isOwnFile(path: string, config: Pick<Config, 'outputUri' | 'dataDir' | 'dbPath'>): boolean {
  const db = realLocation(config.dbPath);
  if (dirname(path) === dirname(db) && basename(path).startsWith(basename(db))) return true;
  if (!config.outputUri.startsWith('file:')) return false;
  return inside(path, realLocation(`${fileURLToPath(config.outputUri)}files`));
}

function checkSpelling(requested: string): string {
  if (Buffer.byteLength(requested) > MAX_OUTPUT_URI_BYTES) throw bad(`at most ${MAX_OUTPUT_URI_BYTES} bytes in UTF-8`);
  const uri = lowerScheme(requested.endsWith('/') ? requested : requested + '/');
  let loc: ReturnType<typeof parseStoreUri>;
  try {
    loc = parseStoreUri(uri);
  } catch (err) {
    throw bad(err instanceof StoreUriError ? err.message : 'not a valid output URI');
  }
  // Refused rather than rewritten: the caller would look for the output under the spelling it gave.
  if (loc.kind === 's3' && loc.prefix.split('/').slice(0, -1).includes('')) throw bad('an s3:// prefix must not contain empty segments ("//")');
  if (loc.kind === 'file' && loc.dir.split('/').includes(TEMP_FOLDER)) throw bad(`${TEMP_FOLDER} holds regen's unfinished writes`);
  return uri;
}

export const isOutputTaken = (err: unknown): boolean =>
  isUniqueViolation(err, 'output_uri') || (err instanceof ApiError && err.code === 'conflict' && err.extra.field === 'output.uri');

export function outputTaken(owner: { id: string; outputUri?: string } | undefined): ApiError {
  const whose = owner ? `run ${owner.id}` : 'another run';
  return new ApiError('conflict', `output.uri overlaps the output of ${whose}: a run's prefix may neither be, lie inside nor hold another's`, {
    field: 'output.uri',
  });
}

/** The folder that holds every run's default prefix (`runs/<id>/`), canonical. */
function defaultOutputsUri(config: Pick<Config, 'outputUri'>): string {
  return canonicalOutputUri(`${config.outputUri}runs/`);
}

/** What a new run asks of its output, as its body says: the prefix, how it is written, and the input it must not replace. */
export interface OutputAsk {
  output?: { uri?: string; format?: OutputFormat; overwrite?: boolean; tokens?: boolean };
  split?: { eval: number };
  input?: { file_id: string } | { uri: string } | { requests: unknown[] };
}

/**
 * The canonical output prefix of a new run, checked: the one asked for, or its own folder under the
 * server's output. Refused (4xx naming output.uri) when it is regen's own store, overlaps another
 * run's prefix, touches the folder of default prefixes, lies outside the allowed roots, holds the
 * run's input, or holds files of the names the run writes (unless output.overwrite).
 */
async function checkedOutputUri(deps: Deps, runId: string, ask: OutputAsk): Promise<string> {
  const { config } = deps;
  const requested = ask.output?.uri;
  const uri = canonicalOutputUri(requested ? checkSpelling(requested) : `${config.outputUri}runs/${runId}/`);
  if (uri.startsWith('file:')) {
    // A local output folder is held to the same roots as local inputs.
    const path = fileURLToPath(uri);
    if (![config.dataDir, ...config.inputRoots].some((root) => inside(path, realLocation(root)))) {
      throw bad('file:// outputs must lie inside the data folder or REGEN_INPUT_ROOTS');
    }
  }
  const own = ownStore(config);
  if (overlaps(uri, own.filesUri) || own.dataUri.startsWith(uri)) throw bad("the data folder and its uploaded files are regen's own store, not an output");
  // Checked here for a clear answer before anything is written; the create's transaction decides a
  // race (insertOwningOutput). A default prefix is new by its id: only a row of an older version can
  // hold it, and that row must not stop every run without output.uri (start-up logs it, warnDefaultOutputsHolders).
  const owner = await ownerOf(deps.db, uri, Boolean(requested));
  if (owner) throw outputTaken(owner);
  // Reserved, so that no run can hold the prefixes of runs yet to come.
  if (requested && overlaps(uri, defaultOutputsUri(config))) throw bad("the runs/ folder of the server's output holds the runs' default prefixes");
  if (requested) await checkContents(deps, uri, ask);
  return uri;
}

/** The run that owns `uri`'s place: for a chosen prefix, any that overlaps it; for a default one, one inside it. */
const ownerOf = (db: DbOrTx, uri: string, requested: boolean) => (requested ? getRunOverlappingOutput(db, uri) : getRunOutputWithin(db, uri));

const holds = (message: string) => new ApiError('conflict', `output.uri ${message}`, { field: 'output.uri' });

/** The input's key under the prefix when the prefix holds it (canonical, as the prefix is), else null. */
function inputKeyWithin(uri: string, input: OutputAsk['input']): string | null {
  if (!input || !('uri' in input)) return null;
  // An S3 key is literal; a file URI is percent-encoded one way (canonicalFileUri), and named as the file's own name.
  if (!input.uri.startsWith('file:')) return input.uri.startsWith(uri) ? input.uri.slice(uri.length) : null;
  const at = pathToFileURL(realLocation(fileURLToPath(input.uri))).href;
  return at.startsWith(uri) ? decodeURIComponent(at.slice(uri.length)) : null;
}

/**
 * A prefix no run owns may still hold someone's files: the run's own input, which its shards could
 * replace (refused whatever the run says, or the run could not be read again), or files of the names
 * the run writes (refused unless the run says output.overwrite).
 */
async function checkContents(deps: Deps, uri: string, ask: OutputAsk): Promise<void> {
  const input = inputKeyWithin(uri, ask.input);
  if (input !== null) throw holds(`holds the run's input (${input}): the run's files could replace it; choose a prefix that does not hold it`);
  if (ask.output?.overwrite) return;
  const store = deps.stores.forUri(uri);
  let found: (string | null)[];
  try {
    found = await Promise.all(
      writtenKeyStarts(ask.output?.format ?? 'jsonl', ask.split?.eval ?? null, ask.output?.tokens ?? false).map((start) => store.findKey(start)),
    );
  } catch (err) {
    throw bad(`the location cannot be listed (${describeStoreError(err)})`);
  }
  const taken = found.find((key) => key !== null);
  if (taken) throw holds(`already holds ${taken}, which the run would replace: choose another prefix, or set output.overwrite to true to replace such files`);
}

/** The canonical output prefix of a run being validated: checked as a create checks it, and probed with nothing left behind. */
export async function outputUriFor(deps: Deps, runId: string, ask: OutputAsk): Promise<string> {
  const uri = await checkedOutputUri(deps, runId, ask);
  try {
    await deps.stores.forUri(uri).check();
  } catch (err) {
    throw bad(`the location cannot be written (${describeStoreError(err)})`);
  }
  return uri;
}

/** A new run's output prefix, taken: the probe's folders kept, the local folder's identity recorded (TakenLocation). */
export async function takeOutput(deps: Deps, runId: string, ask: OutputAsk): Promise<{ uri: string } & TakenLocation> {
  const uri = await checkedOutputUri(deps, runId, ask);
  try {
    // A probe object is written and deleted, so missing credentials or a file in the way are found now, not at the first shard.
    return { uri, ...(await deps.stores.forUri(uri).take()) };
  } catch (err) {
    throw bad(`the location cannot be written (${describeStoreError(err)})`);
  }
}

/**
 * Inserts a new run if no run owns its output's place, in one transaction that creates take in turn
 * (serializeOutputClaims): of racing creates with nested or equal prefixes, one wins and each other
 * is told the winner. The row records the folder as it stands then; `write` adds what goes with the row (its first event).
 */
export async function insertOwningOutput(
  deps: Pick<Deps, 'db'>,
  row: typeof runs.$inferInsert,
  output: TakenLocation,
  requested: boolean,
  write: (tx: DbOrTx) => Promise<void>,
): Promise<void> {
  await deps.db.tx(async (tx) => {
    await serializeOutputClaims(tx);
    const owner = await ownerOf(tx, row.outputUri, requested);
    if (owner) throw outputTaken(owner);
    let outputFolder: string | null;
    try {
      outputFolder = await output.confirm();
    } catch (err) {
      throw bad(`the location changed while the run was created (${describeStoreError(err)})`);
    }
    await insertRun(tx, { ...row, outputFolder });
    await write(tx);
  });
}

/**
 * Removes the folders a refused create's probe made, in turn with the creates: a racing create's
 * folder is then either recorded (and kept) or not yet confirmed (and made again when it is).
 */
export async function giveBackOutput(deps: Pick<Deps, 'db'>, output: TakenLocation): Promise<void> {
  await deps.db.tx(async (tx) => {
    await serializeOutputClaims(tx);
    await output.giveBack(async (folderUri) => (await getRunOutputWithin(tx, folderUri)) !== undefined);
  });
}

/** Logs the runs of older versions whose prefix holds the default prefixes: their outputs and new runs' would mix. */
export async function warnDefaultOutputsHolders(deps: Pick<Deps, 'db' | 'logger' | 'config'>): Promise<void> {
  const reserved = defaultOutputsUri(deps.config);
  for (const { id, outputUri } of await listOutputUris(deps.db)) {
    if (reserved.startsWith(outputUri)) deps.logger.warn({ run_id: id }, "output prefix holds the runs' default prefixes; new runs write inside it");
  }
}

/**
 * Brings the output prefixes of runs made before canonical spellings to the canonical form. Done at
 * start-up, not in a migration: resolving symlinks needs the file system. Two runs whose spellings
 * name one folder cannot both have it; the later keeps its spelling and the log says so.
 */
export async function canonicalizeOutputUris(deps: Pick<Deps, 'db' | 'logger'>): Promise<void> {
  for (const { id, outputUri } of await listOutputUris(deps.db)) {
    if (!outputUri.startsWith('file:')) continue;
    let canonical: string;
    try {
      canonical = canonicalOutputUri(outputUri);
    } catch {
      continue;
    }
    if (canonical === outputUri) continue;
    try {
      await setOutputUri(deps.db, id, canonical);
    } catch (err) {
      if (!isUniqueViolation(err, 'output_uri')) throw err;
      deps.logger.warn({ run_id: id }, "output prefix is another run's under another spelling; left as it was");
    }
  }
}

/**
 * How long a temp file must sit untouched before a start-up sweep takes it for a crash's
 * leftover: another process sharing the store may be writing it, and every write regen makes
 * touches its temp file at least this often (uploads stream into it, a shard is written at once).
 */
export const STALE_TEMP_MS = 60 * 60 * 1000;

/**
 * Removes the temp files of writes a crash cut short: the server's store's and every run's, ended
 * ones too (a crash may have cut a write short just before the run ended); an ended run's temp
 * folder goes with them once empty.
 */
export async function sweepUnfinishedWrites(deps: Pick<Deps, 'db' | 'logger' | 'stores' | 'config' | 'clock'>): Promise<void> {
  const runs = (await listOutputUris(deps.db)).map((r) => ({
    uri: r.outputUri,
    store: deps.stores.forOutput(r.outputUri, r.outputFolder),
    ended: isTerminalRun(r.status),
  }));
  const before = deps.clock() - STALE_TEMP_MS;
  for (const { uri, store, ended } of [{ uri: deps.config.outputUri, store: deps.stores.forUri(deps.config.outputUri), ended: false }, ...runs]) {
    try {
      const swept = await store.sweep(before, ended);
      if (swept) deps.logger.info({ output_uri: uri, swept }, 'unfinished writes removed');
    } catch (err) {
      deps.logger.warn({ output_uri: uri, err: { message: describeStoreError(err) } }, 'unfinished writes could not be swept');
    }
  }
}
