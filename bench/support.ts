import { createReadStream, createWriteStream, readFileSync } from 'node:fs';
import { PrefixCache } from '../src/sim/prefix-cache.js';
import type { SimProcess } from '../src/sim/spawn.js';
import { promptSequence } from '../src/sim/text.js';
import { cpus } from 'node:os';
import { once } from 'node:events';

export interface Figure {
  part: string;
  figure: string;
  regen: number;
  baseline: number | null;
  unit: string;
  /** regen ÷ baseline, or for "lower is better" figures baseline ÷ regen. */
  ratio: number | null;
  target: string;
  ok: boolean | null;
}

/** BENCH_SCALE shrinks every size (the test of the benchmark code runs at a tiny scale). */
export const SCALE = Number(process.env.BENCH_SCALE ?? '1');
export const scaled = (n: number, min = 10) => Math.max(min, Math.round(n * SCALE));

export function machine(): string {
  const cpu = cpus();
  return `${cpu.length} cores (${cpu[0]?.model.trim() ?? 'unknown cpu'}), ${Math.round(Number(readFileSync('/proc/meminfo', 'utf8').match(/MemTotal:\s+(\d+)/)?.[1] ?? 0) / 1048576)} GiB, Node ${process.version}`;
}

/** Peak and current resident memory of a process, in MiB, from /proc. */
export function memoryOf(pid: number): { peakMiB: number; rssMiB: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+)`).exec(status)?.[1] ?? 0);
  return { peakMiB: kb('VmHWM') / 1024, rssMiB: kb('VmRSS') / 1024 };
}

export function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

export function promptLine(i: number): string {
  return JSON.stringify({
    custom_id: `s${i}`,
    messages: [
      { role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: `Question number ${i}: explain the idea behind item ${i % 997} in two sentences.` },
    ],
  });
}

/** Writes n prompt lines to a file through a stream, never holding the file in memory. */
export async function writePrompts(path: string, n: number): Promise<void> {
  const out = createWriteStream(path);
  let chunk: string[] = [];
  for (let i = 0; i < n; i++) {
    chunk.push(promptLine(i));
    if (chunk.length === 10_000 || i === n - 1) {
      if (!out.write(chunk.join('\n') + '\n')) await once(out, 'drain');
      chunk = [];
    }
  }
  out.end();
  await once(out, 'finish');
}

export async function json<T = any>(base: string, path: string, init: RequestInit & { body?: any } = {}): Promise<T> {
  const res = await fetch(base + path, init);
  const text = await res.text();
  if (!res.ok) throw new Error(`${init.method ?? 'GET'} ${path}: ${res.status} ${text.slice(0, 300)}`);
  return JSON.parse(text) as T;
}

/**
 * How long after the process's start any `until` gives up, whatever it asks for: the suite's smoke
 * run of the bench sets it below the time it gives a part, so that a wait that cannot end says
 * which it was rather than being killed with the rest of the part.
 */
const WAIT_LIMIT_MS = waitLimit();

function waitLimit(): number {
  const raw = process.env.BENCH_WAIT_LIMIT_MS;
  if (raw === undefined) return Number.POSITIVE_INFINITY;
  const ms = Number(raw);
  if (raw.trim() === '' || !(ms > 0)) throw new Error(`BENCH_WAIT_LIMIT_MS must be a positive number of milliseconds (got ${JSON.stringify(raw)})`);
  return ms;
}

export async function until<T>(what: string, fn: () => Promise<T | undefined>, ms: number, every = 50): Promise<T> {
  // Counted from the process's start: a part's waits together stay inside it.
  const deadline = Math.min(Date.now() + ms, performance.timeOrigin + WAIT_LIMIT_MS);
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, every));
  }
}

/**
 * Each simulator answers at most `each` more requests and holds the ones after (the simulator's
 * `holdAfter`), so that a run cannot end before a step the bench must take with work left, however
 * fast it goes; resolves with the function that lets every held request go.
 */
export async function holdPast(sims: SimProcess[], each: number): Promise<() => Promise<void>> {
  const served = await Promise.all(sims.map((s) => s.stats()));
  await Promise.all(sims.map((s, i) => s.configure({ holdAfter: served[i].requests + each })));
  return async () => {
    await Promise.all(sims.map((s) => s.configure({ holdAfter: 0 })));
  };
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Streams a prompt file from disk to the Files API, never holding it in memory; returns the file id. */
export async function uploadFile(base: string, path: string): Promise<string> {
  const uploaded = await json<{ id: string }>(base, '/v1/files?filename=prompts.jsonl', {
    method: 'POST',
    headers: { 'content-type': 'application/jsonl' },
    body: createReadStream(path) as unknown as BodyInit,
    duplex: 'half',
  } as RequestInit);
  return uploaded.id;
}

/** Uploads `n` prompt lines and creates a run over them with `run` (model, params, …); returns the run id. */
export async function submitPrompts(base: string, n: number, run: Record<string, unknown>): Promise<string> {
  const body = Array.from({ length: n }, (_, i) => promptLine(i)).join('\n') + '\n';
  const file = await json<{ id: string }>(base, '/v1/files?filename=bench.jsonl', { method: 'POST', headers: { 'content-type': 'application/jsonl' }, body });
  const created = await json<{ id: string }>(base, '/v1/runs', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...run, input: { file_id: file.id } }),
  });
  return created.id;
}

/**
 * The cache-aware reference's routing (SGLang's model gateway cache_aware policy, an approximate tree a server): a request goes to the server whose
 * radix tree matches more than half of its prompt, else to the least loaded; `sent` records what a
 * server's cache now holds.
 */
export function cacheAwareRouter(servers: number, kvTokens: number) {
  const trees = Array.from({ length: servers }, () => new PrefixCache(() => kvTokens));
  return {
    route(messages: Record<string, unknown>[], load: readonly number[]): number {
      const tokens = promptSequence(messages);
      let best = -1;
      let bestLength = 0;
      for (const [i, tree] of trees.entries()) {
        const { length } = tree.match(tokens);
        if (length > bestLength) [best, bestLength] = [i, length];
      }
      if (best >= 0 && bestLength / tokens.length > 0.5) return best;
      return load.indexOf(Math.min(...load));
    },
    sent(server: number, messages: Record<string, unknown>[]): void {
      trees[server].insert(promptSequence(messages));
    },
  };
}
