import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import type { Deps } from '../../deps.js';
import { getRun } from '../../db/runs.js';
import type { RunRow } from '../../db/schema.js';
import { listRunShards } from '../../db/shards.js';
import type { SplitName } from '../../domain/assign.js';
import { outputExpiresAt } from '../../domain/expiry.js';
import type { OutputFormat } from '../../domain/output-format.js';
import { runEndpoint } from '../../domain/run-endpoint.js';
import { ApiError, notFound } from '../../errors.js';
import { describeStoreError, type ObjectStore } from '../../storage/index.js';
import { type ExportFormat, exportWriter, ownExportFormat } from './export-format.js';

// One file of a run's shards (README "Exporting a run as one file"), for a tool that takes one: read shard by
// shard from the output store, each checked against the manifest's sha256 before any of its bytes
// go out, and written out as it is read.

export interface ExportOptions {
  split?: SplitName;
  variant?: string;
  format?: ExportFormat;
}

export interface RunExport {
  format: ExportFormat;
  /** A name for the file: the run's id, and the split and variant it holds. */
  filename: string;
  body: Readable;
}

/** A shard as the manifest lists it. */
interface ManifestShard {
  index: number;
  split: SplitName | null;
  key: string | null;
  sha256: string | null;
}

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

const refuse = (field: string, message: string) => new ApiError('validation_failed', `${field}: ${message}`, { field });

/** The run's shards are all written and listed in its manifest, and still there: else a 409 saying why. */
function checkExportable(run: RunRow, now: number): void {
  const expiresAt = outputExpiresAt(run);
  if (run.outputExpiredAt !== null || (expiresAt !== null && expiresAt <= now)) {
    throw new ApiError('conflict', "the run's output expired and was deleted: there is nothing to export");
  }
  if (run.status !== 'completed' && run.status !== 'cancelled') {
    throw new ApiError(
      'conflict',
      `the run is ${run.status} (${run.shardsUploaded} of ${run.shardsTotal} shards written): a run can be exported once it has ended with its shards written`,
    );
  }
  if (run.manifestKey === null) {
    throw new ApiError('conflict', `the run was ${run.status} before its shards were all written: it has no manifest, and no whole output to export`);
  }
}

/** The variant asked for, checked against the run's; null when none is. */
function checkVariant(run: RunRow, variant: string | undefined): string | null {
  if (variant === undefined) return null;
  const names = run.variants?.map((v) => v.name) ?? [];
  if (!names.length) throw refuse('variant', 'the run has no variants: leave it out');
  if (!names.includes(variant)) throw refuse('variant', `the run has no variant ${JSON.stringify(variant)}; its variants are ${names.join(', ')}`);
  return variant;
}

/** The format to write: the run's own by default; the other only where regen's own writers make it from the shards. */
function checkFormat(run: RunRow, asked: ExportFormat | undefined): ExportFormat {
  const own = ownExportFormat(run.outputFormat as OutputFormat);
  if (asked === undefined || asked === own) return own;
  if (run.outputFormat === 'conversations') {
    throw refuse('format', "a run in the conversations format exports as jsonl only: its lines are SpecForge's, which hold no Parquet row's fields");
  }
  return asked;
}

/** Reads the object store, a failure made a 503 naming what could not be read. */
async function read(store: ObjectStore, key: string): Promise<Buffer> {
  try {
    return await store.get(key);
  } catch (err) {
    throw new ApiError('storage_unavailable', `${key} could not be read from the output store: ${describeStoreError(err)}; try again`);
  }
}

/**
 * The manifest's shards, each as the run's own record has it: a manifest replaced since the run
 * wrote it is no list to check the shards against.
 */
async function manifestShards(deps: Pick<Deps, 'db'>, run: RunRow, store: ObjectStore): Promise<ManifestShard[]> {
  const key = run.manifestKey!;
  let shards: ManifestShard[];
  try {
    shards = (JSON.parse((await read(store, key)).toString('utf8')) as { shards: ManifestShard[] }).shards;
  } catch (err) {
    if (err instanceof ApiError) throw err;
    throw new ApiError('conflict', `${key} is not the manifest the run wrote: it does not parse`);
  }
  const recorded = new Map((await listRunShards(deps.db, run.id)).map((s) => [s.idx, s]));
  for (const s of shards) {
    const row = recorded.get(s.index);
    if (!row || row.key !== s.key || row.sha256 !== s.sha256) {
      throw new ApiError('conflict', `${key} does not agree with the run's record of shard ${s.key ?? s.index}: the manifest was replaced`);
    }
  }
  if (shards.length !== recorded.size) throw new ApiError('conflict', `${key} lists ${shards.length} shards where the run wrote ${recorded.size}`);
  return shards;
}

/** A shard's bytes, read whole (a shard is bounded by the run's shard_size) and checked before any of them is used. */
async function verifiedShard(store: ObjectStore, shard: ManifestShard & { key: string }): Promise<Buffer> {
  const bytes = await read(store, shard.key);
  if (sha256(bytes) !== shard.sha256) {
    throw new ApiError('conflict', `shard ${shard.key} does not match the manifest's sha256: the stored object changed since the run wrote it; export stopped`);
  }
  return bytes;
}

/**
 * A run's completed samples as one file: its shards (of one split, when asked) in the manifest's
 * order, train before eval, each verified before it is used. What can be refused is refused before
 * the answer starts: the run's state, the parameters, the manifest, and the first shard (read and
 * verified here). A later shard that fails its check or cannot be read errors the stream, so that
 * a reader never takes a cut file for a whole one.
 */
export async function exportRun(deps: Pick<Deps, 'db' | 'stores' | 'logger' | 'clock'>, id: string, opts: ExportOptions): Promise<RunExport> {
  const run = await getRun(deps.db, id);
  if (!run) throw notFound('run', id);
  checkExportable(run, deps.clock());
  if (opts.split !== undefined && run.evalShare === null) throw refuse('split', 'the run has no split (it was made without `split`): leave it out');
  const variant = checkVariant(run, opts.variant);
  const format = checkFormat(run, opts.format);
  const store = deps.stores.forUri(run.outputUri);
  const shards = (await manifestShards(deps, run, store))
    .filter((s): s is ManifestShard & { key: string } => s.key !== null && (opts.split === undefined || s.split === opts.split))
    .sort((a, b) => Number(a.split === 'eval') - Number(b.split === 'eval'));
  const first = shards.length ? await verifiedShard(store, shards[0]) : null;
  const writer = exportWriter(run.outputFormat as OutputFormat, format, variant, runEndpoint(run.endpoint));
  // Whatever stops the stream, reading, checking or writing a shard, the log names the run and where.
  const stopped = (at: string | null, err: unknown) => {
    deps.logger.error({ run_id: run.id, shard: at, err: { message: (err as Error).message } }, 'export stopped');
    return err;
  };
  async function* chunks() {
    for (const [i, shard] of shards.entries()) {
      let out: Buffer;
      try {
        out = await writer.shard(i === 0 ? first! : await verifiedShard(store, shard), shard.split);
      } catch (err) {
        throw stopped(shard.key, err);
      }
      if (out.length) yield out;
    }
    let end: Buffer;
    try {
      end = writer.end();
    } catch (err) {
      throw stopped(null, err);
    }
    if (end.length) yield end;
  }
  const filename = [run.id, opts.split, variant].filter(Boolean).join('-') + (format === 'parquet' ? '.parquet' : '.jsonl');
  return { format, filename, body: Readable.from(chunks(), { objectMode: false }) };
}
