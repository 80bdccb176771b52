import { randomUUID } from 'node:crypto';
import { createReadStream, readFileSync, statSync } from 'node:fs';
import { basename } from 'node:path';
import { Readable } from 'node:stream';
import type { components } from '../client/index.js';
import { ApiCallError, Client, UsageError, type ClientOptions } from './client.js';
import { num, statusWithReason, TERMINAL } from './format.js';
import { parseParams } from './params.js';
import type { RegenerateMode } from '../domain/run-settings.js';
import type { RunEndpoint } from '../domain/run-endpoint.js';
import { watchRun } from './watch.js';

export interface SubmitOptions extends ClientOptions {
  model: string;
  param: string[];
  name?: string;
  shardSize?: number;
  regenerate?: RegenerateMode;
  onInvalidLine?: 'fail' | 'skip';
  onLength?: 'keep' | 'retry' | 'fail';
  /** The run's variants as JSON, or `@file` holding it. */
  variants?: string;
  format?: 'jsonl' | 'conversations' | 'parquet';
  evalShare?: number;
  endpoint?: RunEndpoint;
  watch?: boolean;
}

/** `--variants`: a JSON array, inline or `@path`; the server checks its contents. */
function readVariants(arg: string): RunDraft['variants'] {
  let text = arg;
  if (arg.startsWith('@')) {
    try {
      text = readFileSync(arg.slice(1), 'utf8');
    } catch {
      throw new UsageError(`--variants: cannot read ${arg.slice(1)}`);
    }
  }
  try {
    return JSON.parse(text) as RunDraft['variants'];
  } catch {
    throw new UsageError('--variants: not JSON: expected [{"name": …, "weight": …, "params": {…}}, …], inline or as @file');
  }
}

type Run = components['schemas']['Run'];
type RunDraft = components['schemas']['ValidateRun'];
type RunWarning = components['schemas']['RunWarning'];

/** How often a submitted run is looked at until its input is validated and it starts. */
const POLL_MS = 500;
/**
 * How long a validated run may take to start before it is said to wait: the runner looks at the
 * queue ten times a second, and says why a run waits (no endpoint serves it) within a tick or two.
 */
const START_WAIT_MS = 3000;

/** Prints the warnings not printed yet; the same warning from the check and the create is printed once. */
function warn(warnings: RunWarning[] | undefined, printed: Set<string>): void {
  for (const w of warnings ?? []) {
    if (printed.has(w.message)) continue;
    printed.add(w.message);
    process.stderr.write(`warning: ${w.field}: ${w.message}\n`);
  }
}

/**
 * Checks a run's body before its input is uploaded (POST /v1/runs/validate): a refused param costs
 * a round trip, not the upload of a file of gigabytes. Prints the warnings the run would carry.
 */
export async function checkRun(client: Client, draft: RunDraft, printed: Set<string>): Promise<void> {
  const checked = await client.post('/v1/runs/validate', { body: draft });
  warn(checked.warnings, printed);
}

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
  const draft: RunDraft = {
    model: opts.model,
    ...(opts.name !== undefined && { name: opts.name }),
    ...(Object.keys(params).length > 0 && { params }),
    ...(opts.shardSize !== undefined && { shard_size: opts.shardSize }),
    ...(opts.endpoint !== undefined && { endpoint: opts.endpoint }),
    ...(opts.regenerate !== undefined && { regenerate: opts.regenerate }),
    ...(opts.onInvalidLine !== undefined && { on_invalid_line: opts.onInvalidLine }),
    ...(opts.onLength !== undefined && { on_length: opts.onLength }),
    ...(opts.variants !== undefined && { variants: readVariants(opts.variants) }),
    ...(opts.format !== undefined && { output: { format: opts.format } }),
    ...(opts.evalShare !== undefined && { split: { eval: opts.evalShare } }),
  };
  const printed = new Set<string>();
  await checkRun(client, draft, printed);
  process.stderr.write(`uploading ${file} (${num(size)} bytes)\n`);
  const uploaded = await upload(client, file);
  let run: Run;
  try {
    run = await createRun(client, { ...draft, input: { file_id: uploaded.id } });
  } catch (err) {
    // A refused run leaves nothing behind; after a lost connection the run may exist, so the file stays.
    if (err instanceof ApiCallError && err.status >= 400 && err.status < 500)
      await client.delete('/v1/files/{id}', { params: { path: { id: uploaded.id } } }).catch(() => {});
    throw err;
  }
  process.stdout.write(`${run.id}\n`);
  process.stderr.write(`created run ${run.id} from ${uploaded.id}; follow it with \`regen status ${run.id}\` or at ${client.base}/#/runs/${run.id}\n`);
  warn(run.warnings, printed);
  return opts.watch ? watchRun(client, run.id) : await untilStarted(client, run);
}

/**
 * Waits for the run's input to be validated and the run to start, and says how it stands: a run
 * whose input was refused exits 1, and one that waits (queued, paused) says why.
 */
async function untilStarted(client: Client, created: Run): Promise<number> {
  const get = () => client.get('/v1/runs/{id}', { params: { path: { id: created.id } } });
  let run = created;
  if (run.status === 'validating') process.stderr.write('waiting for the server to validate the input (Ctrl-C stops waiting, not the run)\n');
  while (run.status === 'validating') {
    await new Promise((r) => setTimeout(r, POLL_MS));
    run = await get();
  }
  const startBy = Date.now() + START_WAIT_MS;
  while (run.status === 'queued' && !run.status_reason && Date.now() < startBy) {
    await new Promise((r) => setTimeout(r, POLL_MS));
    run = await get();
  }
  if (TERMINAL.includes(run.status)) {
    process.stderr.write(`run ${run.id} ${run.status}${run.status_reason ? `: ${run.status_reason}` : ''}\n`);
    return run.status === 'completed' ? 0 : 1;
  }
  process.stderr.write(`run ${run.id} is ${statusWithReason(run)}\n`);
  return 0;
}
