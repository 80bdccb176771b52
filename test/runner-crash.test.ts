import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import {
  checkDatabase,
  checkOutput,
  createRun,
  expectCountersMatchRecount,
  getRun,
  makePrompts,
  registerEndpoint,
  uploadFile,
  waitForStatus,
} from './support/runner-checks.js';

// As many samples as it takes for each kill to land in a live dispatch: at ~200 answers a second
// across the two simulators, 30% of the run between kills is a couple of seconds of work.
const SAMPLES = 1200;
const SHARD_SIZE = 100;
const LATENCY = { 'ttft-ms': 30, 'tokens-per-second': 1000 };

const data = tempDir('regen-crash-');
const sims: SimProcess[] = [];
let server: ServerProcess | null = null;

beforeAll(async () => {
  sims.push(await spawnSimulator({ ...LATENCY, 'max-running': 16, seed: 1 }));
  sims.push(await spawnSimulator({ ...LATENCY, 'max-running': 8, seed: 2 }));
});

afterAll(async () => {
  await server?.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  data.cleanup();
});

const doneOf = (run: any) => run.request_counts.completed + run.request_counts.failed + run.request_counts.cancelled;

describe('a run through repeated SIGKILLs of the server', () => {
  // Four starts of `regen serve`: each a few seconds on a quiet machine, past ten on a loaded one.
  it('finishes with every prompt answered exactly once and the manifest matching the shards', { timeout: 300_000 }, async () => {
    server = await spawnServer(data.dir);
    for (const s of sims) await registerEndpoint(server.url, s.url);
    const prompts = makePrompts(SAMPLES, 'c');
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const { id } = await createRun(server.url, { model: 'sim-model', input: { file_id: fileId }, shard_size: SHARD_SIZE, regenerate: 'last_assistant' });

    const kills: { at: number; inFlight: number }[] = [];
    for (const fraction of [0.1, 0.4, 0.7]) {
      const url = server.url;
      const seen = await waitFor(
        `run ${id} to pass ${fraction * 100}%`,
        async () => {
          const run = (await call(url, `/v1/runs/${id}`)).body;
          return doneOf(run) >= fraction * SAMPLES ? run : undefined;
        },
        90_000,
        50,
      );
      expect(seen.status).toBe('in_progress');
      await server.kill('SIGKILL');
      kills.push({ at: doneOf(seen), inFlight: seen.request_counts.in_progress });
      // What the killed process left is consistent as it stands, before any recovery.
      const left = await checkDatabase(data.dir, id);
      expect(left.completed).toBeGreaterThanOrEqual(kills.at(-1)!.at);
      server = await spawnServer(data.dir);
      // The endpoints live in the database: the new process dispatches to them without being told again.
      const after = await getRun(server.url, id);
      expect(doneOf(after)).toBeGreaterThanOrEqual(kills.at(-1)!.at);
    }
    // Each kill really interrupted work in flight.
    expect(kills.every((k) => k.inFlight > 0)).toBe(true);

    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled']);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    expect(done.shards).toEqual({ total: SAMPLES / SHARD_SIZE, uploaded: SAMPLES / SHARD_SIZE });

    const stores = new Stores({ forcePathStyle: false });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    expect(out.errors.size).toBe(0);
    expect(out.manifest.counts).toEqual({ total: SAMPLES, completed: SAMPLES, failed: 0, cancelled: 0 });
    const tokens = [...out.lines.values()].reduce((t, l) => t + l.usage.completion_tokens, 0);
    expect(out.manifest.usage.completion_tokens).toBe(tokens);
    // A request cut short by a crash is not held against the sample: nothing here ever failed.
    expect([...out.lines.values()].filter((l) => l.attempts !== 1).map((l) => [l.custom_id, l.attempts])).toEqual([]);

    const all = await expectCountersMatchRecount(server.url, done);
    expect(all.every((s) => s.status === 'completed')).toBe(true);
    // The simulators answered some prompts twice (in flight at a kill); the output still has each once.
    const answered = (await Promise.all(sims.map((s) => s.stats()))).reduce((t, s) => t + s.completed, 0);
    expect(answered).toBeGreaterThanOrEqual(SAMPLES);
  });
});
