import { pathToFileURL } from 'node:url';
import * as arrow from 'apache-arrow';
import * as pq from 'parquet-wasm/node';
import type { OutputFormat, ParquetRow } from '../src/domain/output-format.js';
import { type CompletedSample, outputRecord } from '../src/domain/output-line.js';
import { encodeShard, putChecked, recordOf, writeShardFiles } from '../src/runner/shard-writer.js';
import { Stores } from '../src/storage/index.js';
import { type GenerationIds, type StagedIds, stagedIds, tokenRow } from '../src/domain/token-rows.js';
import { encodeTokens, parquetModule, sampleTokenRows, tokenParquetModule } from '../src/runner/token-shard.js';

// One format's writing, in a process of its own so that its peak RSS is its own: `samples`
// synthetic completed samples, `shardSize` at a time, through the shard writer's code path (the
// output line, the format's record, then the upload's writeShardFiles: the shard's bytes, stored,
// read back and checked by putChecked, the bytes compared and for Parquet the row count) into a
// local store. `parquet-hyp` (regen's writer) and `parquet-wasm` (parquet-wasm + apache-arrow,
// zstd, the writer not chosen) write the same rows with their encoding timed apart, for the
// comparison.
// `jsonl+tokens` and `parquet+tokens` also write each shard's training rows (output.tokens): the
// sample's 80 prompt ids and 600 generated ids, staged with its text as the runner stages them.
// Times and CPU count the writing only: each shard's synthetic samples (random words and ids, as an
// answer would bring them) are made, and their garbage collected, with the clock stopped, as no
// writer makes them.

const [format, samplesArg, shardArg, dir, firstArg = '0'] = process.argv.slice(2) as [string, string, string, string, string?];
const SAMPLES = Number(samplesArg);
/** The first sample's number: rounds of one bench write different samples. */
const FIRST = Number(firstArg);
const SHARD = Number(shardArg);
/**
 * `tokens-file`: only the JSONL training rows' file, from ids already in memory (each row's ids one
 * Int32Array, made with the clock stopped, as ids kept apart from the staged JSON and read without
 * a copy would come): its lines made, then stored, synced, read back, compared and hashed as the
 * upload does. What the file itself costs, however the ids are staged: JSONL with tokens takes at
 * least the text's time and this.
 */
const FILE_ONLY = format === 'tokens-file';
const TOKENS = format.endsWith('+tokens') || FILE_ONLY;
/** The two Parquet writers compared (`parquet-hyp`, regen's, and `parquet-wasm`): their encoding timed apart from the upload. */
const COMPARED = format === 'parquet-hyp' || format === 'parquet-wasm';

// Text that does not compress to nothing: words drawn by a seeded generator from a 2,000-word vocabulary.
let state = 12345;
const rand = () => {
  state = (Math.imul(state, 1103515245) + 12345) >>> 0;
  return state / 2 ** 32;
};
const vocab = Array.from({ length: 2000 }, (_, i) => (i * 2654435761).toString(36).slice(0, 3 + (i % 7)));
const words = (chars: number) => {
  const out: string[] = [];
  let n = 0;
  while (n < chars) {
    const w = vocab[Math.floor(rand() * vocab.length)]!;
    out.push(w);
    n += w.length + 1;
  }
  return out.join(' ');
};

const ids = (n: number) => Array.from({ length: n }, () => Math.floor(rand() * 151_643));

interface Staged {
  content: string;
  reasoning_content: string;
  model: string;
  tokens?: StagedIds[];
}

function sample(i: number): { s: CompletedSample; staged: Staged; ids?: GenerationIds } {
  const request = JSON.stringify({
    messages: [
      { role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: `Question ${i}: ${words(200)}` },
    ],
  });
  return {
    s: {
      customId: `s${i}`,
      sampleIndex: 0,
      request,
      finishReason: 'stop',
      promptTokens: 80,
      completionTokens: 600,
      reasoningTokens: 400,
      cachedTokens: 0,
      endpointId: 'ep_bench',
      latencyMs: 1000 + (i % 5000),
      attempts: 1,
      serverFaults: 0,
      flags: i % 50 === 0 ? 4 : 0,
    },
    staged: {
      content: words(800),
      reasoning_content: words(1600),
      model: 'bench-model',
    },
    ...(TOKENS && { ids: { prompt: ids(80), output: ids(600) } }),
  };
}

function wasmParquet(rows: ParquetRow[]): Buffer {
  const s = (name: string) => new arrow.Field(name, new arrow.Utf8(), true);
  const i32 = (name: string) => new arrow.Field(name, new arrow.Int32(), true);
  const usage = new arrow.Struct(['prompt_tokens', 'completion_tokens', 'reasoning_tokens', 'cached_tokens'].map(i32));
  const messages = new arrow.List(new arrow.Field('item', new arrow.Struct([s('role'), s('content'), s('reasoning_content')]), true));
  const v = (name: keyof ParquetRow, t: arrow.DataType) => arrow.vectorFromArray(rows.map((r) => r[name]) as never[], t as never);
  const table = new arrow.Table({
    custom_id: v('custom_id', new arrow.Utf8()),
    messages: v('messages', messages),
    content: v('content', new arrow.Utf8()),
    reasoning_content: v('reasoning_content', new arrow.Utf8()),
    finish_reason: v('finish_reason', new arrow.Utf8()),
    usage: v('usage', usage),
    flags: v('flags', new arrow.List(s('item'))),
    variant: v('variant', new arrow.Utf8()),
    sample_index: v('sample_index', new arrow.Int32()),
    split: v('split', new arrow.Utf8()),
    metadata: v('metadata', new arrow.Utf8()),
    turns: v('turns', new arrow.Utf8()),
    endpoint_id: v('endpoint_id', new arrow.Utf8()),
    latency_ms: v('latency_ms', new arrow.Int32()),
    attempts: v('attempts', new arrow.Int32()),
    model: v('model', new arrow.Utf8()),
  });
  const props = new pq.WriterPropertiesBuilder().setCompression(pq.Compression.ZSTD).build();
  return Buffer.from(pq.writeParquet(pq.Table.fromIPCStream(arrow.tableToIPC(table, 'stream')), props));
}

const stores = new Stores({ forcePathStyle: false });
const store = stores.forUri(`${pathToFileURL(dir).href}/`);
const shardFormat = (COMPARED ? 'parquet' : FILE_ONLY ? 'jsonl' : format.replace('+tokens', '')) as OutputFormat;
// The runner loads the Parquet modules on first use; loaded here first, so no shard's time counts their load.
if (shardFormat === 'parquet') await Promise.all([parquetModule(), tokenParquetModule()]);
let bytes = 0;
/** The staged outputs' bytes: what the staging table holds until a shard is written. */
let stagedBytes = 0;
let encodeMs = 0;
let wallMs = 0;
let cpuUs = 0;
for (let first = 0, idx = 0; first < SAMPLES; first += SHARD, idx++) {
  const n = Math.min(SHARD, SAMPLES - first);
  const samples = Array.from({ length: n }, (_, k) => sample(FIRST + first + k));
  const fileRows =
    FILE_ONLY &&
    samples.map(({ s, ids }) =>
      tokenRow({ ...s, turn: null, step: null, variant: null, split: null }, Int32Array.from([...ids!.prompt, ...ids!.output]), ids!.output.length),
    );
  // Collected with the clock stopped too: making the samples left garbage (the words, the ids' arrays
  // a server's answer would have brought long before), and the samples themselves, young, would be
  // copied by every collection the writing triggers. No writer holds a shard's ids as fresh arrays.
  (globalThis as { gc?: () => void }).gc?.();
  const started = performance.now();
  const cpuStart = process.cpuUsage();
  if (fileRows) {
    const { body } = await encodeTokens('jsonl', fileRows, '');
    await putChecked(store, `tokens/shard-${String(idx).padStart(5, '0')}.jsonl`, body);
    bytes += body.length;
    wallMs += performance.now() - started;
    const cpu = process.cpuUsage(cpuStart);
    cpuUs += cpu.user + cpu.system;
    continue;
  }
  // Staged as the runner stages them: the ids packed, as JSON text, parsed again when the shard is written.
  const staged = samples.map((x) => {
    const tokens: StagedIds[] | undefined = x.ids && [{ turn: null, step: null, finish_reason: 'stop', flags: 0, ...stagedIds(x.ids) }];
    const text = JSON.stringify({ ...x.staged, ...(tokens && { tokens }) });
    stagedBytes += Buffer.byteLength(text);
    return JSON.parse(text) as Staged;
  });
  // The writer comparison times the encoding from here: line → record → shard bytes.
  const encodeStart = performance.now();
  const records = samples.map(({ s }, k) => recordOf(shardFormat, outputRecord(s, staged[k]!), null));
  if (COMPARED) {
    // The writer comparison: the encoding timed alone, then the upload.
    const key = `shard-${String(idx).padStart(5, '0')}.parquet`;
    const { body, check } =
      format === 'parquet-wasm' ? { body: wasmParquet(records as ParquetRow[]), check: undefined } : await encodeShard(shardFormat, records, key);
    encodeMs += performance.now() - encodeStart;
    await putChecked(store, key, body, check);
    bytes += body.length;
  } else {
    // The upload's own writer: text and training rows written at once, as a shard's upload writes them.
    const tokenRows = TOKENS ? samples.flatMap(({ s }, k) => sampleTokenRows(s, staged[k]!.tokens, null, null)) : null;
    const shard = { idx, split: null, key: null, errorsKey: null, tokensKey: null };
    const written = (await writeShardFiles(store, shardFormat, shard, { records, errors: [], tokenRows }))!;
    bytes += (written.bytes ?? 0) + (written.tokensBytes ?? 0);
  }
  wallMs += performance.now() - started;
  const cpu = process.cpuUsage(cpuStart);
  cpuUs += cpu.user + cpu.system;
}
stores.close();
process.stdout.write(
  JSON.stringify({
    format,
    samples: SAMPLES,
    wallMs,
    cpuMs: cpuUs / 1000,
    encodeMs,
    bytes,
    stagedBytes,
    peakRssMiB: process.resourceUsage().maxRSS / 1024,
  }) + '\n',
);
