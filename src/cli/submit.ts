import { randomUUID } from 'node:crypto';
import { createReadStream, statSync } from 'node:fs';
import { basename } from 'node:path';
import { Readable } from 'node:stream';
import type { components } from '../client/index.js';
import { ApiCallError, Client, UsageError, type ClientOptions } from './client.js';
import { num } from './format.js';
import { parseParams } from './params.js';
import { watchRun } from './watch.js';

export interface SubmitOptions extends ClientOptions {
  model: string;
  param: string[];
  name?: string;
  shardSize?: number;
  regenerate?: 'last_assistant';
  watch?: boolean;
}

type Run = components['schemas']['Run'];

/** Streams the file to POST /v1/files: a file of any size never sits in memory. */
export function upload(client: Client, file: string) {
  return client.upload(basename(file), Readable.toWeb(createReadStream(file)) as unknown as ReadableStream<Uint8Array>);
}

/** POST /v1/runs, retried on a dropped connection or a 5xx with the same Idempotency-Key, so it is created once. */
export async function createRun(client: Client, body: components['schemas']['CreateRun']): Promise<Run> {
  const key = `regen-cli-${randomUUID()}`;
  for (let attempt = 1; ; attempt++) {
    try {
      return await client.post('/v1/runs', { body, params: { header: { 'idempotency-key': key } } });
    } catch (err) {
      const retriable = err instanceof ApiCallError && (err.status === 0 || err.status >= 500);
      if (!retriable || attempt >= 3) throw err;
      await new Promise((r) => setTimeout(r, 1000 * attempt));
    }
  }
}

/** `regen submit FILE --model M`: upload, create the run, print its id; with --watch, follow it. */
export async function submitCommand(file: string, opts: SubmitOptions): Promise<number> {
  let size: number;
  try {
    const stat = statSync(file);
    if (!stat.isFile()) throw new Error('not a file');
    size = stat.size;
  } catch (err) {
    throw new UsageError(`cannot read ${file}: ${(err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : 'not a readable file'}`);
  }
  const params = parseParams(opts.param);
  const client = new Client(opts);
  process.stderr.write(`uploading ${file} (${num(size)} bytes)\n`);
  const uploaded = await upload(client, file);
  let run: Run;
  try {
    run = await createRun(client, {
      model: opts.model,
      input: { file_id: uploaded.id },
      ...(opts.name !== undefined && { name: opts.name }),
      ...(Object.keys(params).length > 0 && { params }),
      ...(opts.shardSize !== undefined && { shard_size: opts.shardSize }),
      ...(opts.regenerate !== undefined && { regenerate: opts.regenerate }),
    });
  } catch (err) {
    // A refused run leaves nothing behind; after a lost connection the run may exist, so the file stays.
    if (err instanceof ApiCallError && err.status >= 400 && err.status < 500)
      await client.delete('/v1/files/{id}', { params: { path: { id: uploaded.id } } }).catch(() => {});
    throw err;
  }
  process.stdout.write(`${run.id}\n`);
  process.stderr.write(`created run ${run.id} from ${uploaded.id}; follow it with \`regen status ${run.id}\` or at ${client.base}/#/runs/${run.id}\n`);
  return opts.watch ? watchRun(client, run.id) : 0;
}
