import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { open, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { Readable } from 'node:stream';
import type { ReadableStream as WebStream } from 'node:stream/web';
import { ApiCallError, Client, type ClientOptions, UsageError } from './client.js';

export interface ExportOptions extends ClientOptions {
  split?: 'train' | 'eval';
  variant?: string;
  format?: 'jsonl' | 'parquet';
  output?: string;
}

/** Writes the body to stdout; a reader that stops reading (`| head`) ends the export, not the process with a stack. */
async function toStdout(body: AsyncIterable<Buffer>): Promise<void> {
  let closed: Error | null = null;
  const onError = (err: Error) => (closed = err);
  process.stdout.on('error', onError);
  try {
    for await (const chunk of body) {
      if (closed) throw closed;
      if (!process.stdout.write(chunk)) await once(process.stdout, 'drain');
    }
  } finally {
    process.stdout.off('error', onError);
  }
}

/** Writes the body beside `path` and renames it into place once whole and on disk: a reader never finds half a file there. */
async function toFile(body: AsyncIterable<Buffer>, path: string): Promise<void> {
  const temp = join(dirname(path), `.${basename(path)}.${randomBytes(4).toString('hex')}.tmp`);
  const file = await open(temp, 'wx').catch((err: NodeJS.ErrnoException) => {
    throw new UsageError(`-o: cannot write beside ${path} (${err.code ?? err.message})`);
  });
  try {
    for await (const chunk of body) await file.write(chunk);
    await file.sync();
  } catch (err) {
    await file.close();
    await rm(temp, { force: true });
    throw err;
  }
  await file.close();
  await rename(temp, path).catch(async (err: NodeJS.ErrnoException) => {
    await rm(temp, { force: true });
    throw new UsageError(`-o: cannot put the file at ${path} (${err.code ?? err.message})`);
  });
}

/** `-o` names a file to write, not a folder: refused before anything is asked of the server. */
async function checkOutputPath(path: string): Promise<void> {
  const at = await stat(path).catch(() => null);
  if (path.endsWith('/') || at?.isDirectory()) throw new UsageError(`-o: ${path} is a folder; name the file to write, say ${join(path, 'run.parquet')}`);
}

/**
 * `regen export RUN`: the run's completed samples as one file (GET /v1/runs/{id}/export), to
 * stdout or to `-o FILE`. A refusal, a shard that fails its check, or a cut-off stream exits 1
 * (2 for a refused parameter); with `-o` no file is left behind.
 */
export async function exportCommand(runId: string, opts: ExportOptions): Promise<number> {
  if (opts.output !== undefined) await checkOutputPath(opts.output);
  const client = new Client(opts);
  const query = { split: opts.split, variant: opts.variant, format: opts.format };
  const { data, error, response } = await client.api.GET('/v1/runs/{id}/export', { params: { path: { id: runId }, query }, parseAs: 'stream' });
  if (!response.ok || !data) throw new ApiCallError(response.status, error);
  const body = Readable.fromWeb(data as WebStream<Uint8Array>);
  let received = 0;
  async function* counted() {
    for await (const chunk of body as AsyncIterable<Buffer>) {
      received += chunk.length;
      yield chunk;
    }
  }
  try {
    await (opts.output === undefined ? toStdout(counted()) : toFile(counted(), opts.output));
  } catch (err) {
    if (!body.errored) throw err;
    // fetch says "terminated"; why is in its cause ("other side closed").
    const cause = (body.errored as { cause?: { message?: string } }).cause?.message ?? (body.errored as Error).message;
    throw new Error(
      `the export of ${runId} broke off after ${received.toLocaleString('en-US')} bytes (${cause}): the server stops an export at a shard that does not match the manifest or cannot be read, and its log names it${opts.output === undefined ? '; what was written is incomplete' : `; ${opts.output} was not written`}`,
    );
  }
  if (opts.output !== undefined) process.stdout.write(`${opts.output}: ${received.toLocaleString('en-US')} bytes (${runId})\n`);
  return 0;
}
