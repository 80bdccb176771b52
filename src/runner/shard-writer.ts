import { createHash } from 'node:crypto';
import type { RunnerDeps } from '../deps.js';
import { setManifestKey } from '../db/runs.js';
import type { RunRow, ShardRow } from '../db/schema.js';
import { listRunShards, markShardUploaded, openShardNow, shardSamplesWithOutput } from '../db/shards.js';
import { flagCounts } from '../domain/flags.js';
import { listRunVariants } from '../db/run-variants.js';
import { errorLine, lineKey, MANIFEST_KEY, outputLine, runUsage, shardErrorsKey, shardKey, type StagedOutput } from '../domain/output-line.js';

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** Lines of an earlier upload of this shard, by custom_id and sample_index (lineKey): the only copy once staging was cleared. */
async function previousLines(deps: RunnerDeps, run: RunRow, shard: ShardRow): Promise<Map<string, string>> {
  const map = new Map<string, string>();
  if (!shard.key) return map;
  const bytes = await deps.stores.forUri(run.outputUri).get(shard.key);
  // Only the object this shard wrote may be trusted, not whatever now sits at its key.
  if (sha256(bytes) !== shard.sha256) throw new Error(`${shard.key} no longer holds the shard uploaded before`);
  const text = bytes.toString('utf8');
  for (const line of text.split('\n')) {
    if (!line) continue;
    const parsed = JSON.parse(line) as { custom_id: string; sample_index?: number };
    map.set(lineKey(parsed.custom_id, parsed.sample_index), line);
  }
  return map;
}

async function putVerified(deps: RunnerDeps, run: RunRow, key: string, body: Buffer): Promise<string> {
  const store = deps.stores.forUri(run.outputUri);
  const digest = sha256(body);
  await store.put(key, body);
  const back = await store.get(key);
  if (back.length !== body.length || sha256(back) !== digest) throw new Error(`verification of ${key} failed: the stored bytes differ`);
  return digest;
}

/**
 * Writes one shard whose samples are all terminal: completed samples in input order to
 * shard-NNNNN.jsonl (none when there are none), failed ones to shard-NNNNN.errors.jsonl, each read back and checked; only then
 * is the shard marked uploaded and its staging rows dropped. The bytes depend only on the database,
 * so writing a shard again produces the same object. Returns false when the shard changed meanwhile.
 */
export async function uploadShard(deps: RunnerDeps, run: RunRow, listed: ShardRow): Promise<boolean> {
  // The row the caller listed may be stale: an upload of this shard that ended meanwhile marked
  // it uploaded and dropped its staging rows, and its samples would be read without their outputs.
  const shard = await openShardNow(deps.db, run.id, listed);
  if (!shard) return false;
  const rows = await shardSamplesWithOutput(deps.db, run.id, shard);
  let previous: Map<string, string> | undefined;
  const lines: string[] = [];
  const lineOf: { id: number; line: number }[] = [];
  const errors: string[] = [];
  const variants = run.variants?.map((v) => v.name) ?? null;
  for (const { s, output } of rows) {
    if (s.status === 'completed') {
      let line: string;
      if (output) line = outputLine(s, JSON.parse(output) as StagedOutput, variants);
      else {
        previous ??= await previousLines(deps, run, shard);
        const old = previous.get(lineKey(s.customId, s.sampleIndex));
        if (!old) throw new Error(`sample ${s.customId} has no output in staging or in the earlier shard`);
        line = old;
      }
      lines.push(line);
      lineOf.push({ id: s.id, line: lines.length });
    } else if (s.status === 'failed') errors.push(errorLine(s));
    else if (s.status !== 'cancelled') return false;
  }
  const store = deps.stores.forUri(run.outputUri);
  // A shard with no completed line writes no object (a run cancelled early would leave one empty
  // file per shard); the manifest lists it as empty, so the shard count still adds up.
  let shardMeta = { key: null as string | null, bytes: 0, lines: 0, sha256: null as string | null };
  if (lines.length) {
    const body = Buffer.from(lines.join('\n') + '\n');
    const key = shardKey(shard.idx);
    shardMeta = { key, bytes: body.length, lines: lines.length, sha256: await putVerified(deps, run, key, body) };
  } else if (shard.key) {
    await store.delete(shard.key);
  }
  let errorsMeta = {
    errorsKey: null as string | null,
    errorsBytes: null as number | null,
    errorsLines: null as number | null,
    errorsSha256: null as string | null,
  };
  if (errors.length) {
    const eb = Buffer.from(errors.join('\n') + '\n');
    const ek = shardErrorsKey(shard.idx);
    errorsMeta = { errorsKey: ek, errorsBytes: eb.length, errorsLines: errors.length, errorsSha256: await putVerified(deps, run, ek, eb) };
  } else if (shard.errorsKey) {
    await store.delete(shard.errorsKey);
  }
  const written = { ...shardMeta, ...errorsMeta };
  return await markShardUploaded(deps.db, run.id, shard, { ...written, lineOf, errorCount: errors.length }, deps.clock());
}

/** The manifest: everything needed to check the output without the database. */
export async function writeManifest(deps: RunnerDeps, run: RunRow, finalStatus: 'completed' | 'cancelled'): Promise<void> {
  const all = await listRunShards(deps.db, run.id);
  const variantRows = run.variants?.length ? await listRunVariants(deps.db, run.id) : [];
  const manifest = {
    run: { id: run.id, name: run.name, model: run.model, status: finalStatus, created_at: new Date(run.createdAt).toISOString(), metadata: run.metadata },
    params: run.params,
    output_uri: run.outputUri,
    counts: { total: run.total, completed: run.completed, failed: run.failed, cancelled: run.cancelled },
    usage: runUsage(run),
    quality: {
      flagged: run.flagged,
      by_flag: flagCounts(run),
      // false, as the API shows it, when the run turned quality checks off.
      settings: run.quality ?? false,
    },
    on_length: run.onLength,
    // Each variant with its params and what its samples came to; null for a run without variants.
    variants: run.variants?.length
      ? run.variants.map((v, idx) => {
          const c = variantRows.find((r) => r.idx === idx);
          return {
            name: v.name,
            weight: v.weight,
            params: v.params ?? {},
            counts: { total: c?.total ?? 0, completed: c?.completed ?? 0, failed: c?.failed ?? 0 },
            usage: { prompt_tokens: c?.promptTokens ?? 0, completion_tokens: c?.completionTokens ?? 0, reasoning_tokens: c?.reasoningTokens ?? 0 },
            quality: { flagged: c?.flagged ?? 0, by_flag: c ? flagCounts(c) : null },
          };
        })
      : null,
    shards: all.map((s) => ({
      index: s.idx,
      empty: !s.lines,
      key: s.key,
      bytes: s.bytes,
      lines: s.lines,
      sha256: s.sha256,
      errors_key: s.errorsKey,
      errors_bytes: s.errorsBytes,
      errors_lines: s.errorsLines,
      errors_sha256: s.errorsSha256,
    })),
  };
  await putVerified(deps, run, MANIFEST_KEY, Buffer.from(JSON.stringify(manifest, null, 2) + '\n'));
  await setManifestKey(deps.db, run.id, MANIFEST_KEY);
}
