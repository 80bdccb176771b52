import { once } from 'node:events';
import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
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

const TERMINAL = ['completed', 'failed', 'cancelled', 'paused'];
/** Samples of the drained run: ten waves of its simulator's 16 slots, the signal landing in the third. */
const DRAINED = 160;
const sims: SimProcess[] = [];
const stores = new Stores({ forcePathStyle: false });

async function sim(flags: Record<string, string | number>): Promise<SimProcess> {
  const s = await spawnSimulator({ 'tokens-per-second': 1000, ...flags });
  sims.push(s);
  return s;
}

const doneOf = (run: any) => run.request_counts.completed + run.request_counts.failed + run.request_counts.cancelled;

async function waitForDone(base: string, id: string, n: number): Promise<any> {
  return waitFor(`run ${id} to have ${n} samples done`, async () => {
    const run = await getRun(base, id);
    return doneOf(run) >= n ? run : undefined;
  });
}

afterAll(async () => {
  await Promise.all(sims.map((s) => s.stop()));
  stores.close();
});

describe('signals with requests in flight', () => {
  const data = tempDir('regen-drain-');
  let proc: ServerProcess | null = null;
  afterAll(async () => {
    await proc?.kill('SIGKILL');
    data.cleanup();
  });

  it('drains, exits 0, and on restart finishes with nothing lost or written twice', async () => {
    const s = await sim({ model: 'm-drain', 'max-running': 16, 'ttft-ms': 300 });
    proc = await spawnServer(data.dir, { REGEN_SHUTDOWN_GRACE_MS: '15000' });
    await registerEndpoint(proc.url, s.url);
    const prompts = makePrompts(DRAINED, 'drain');
    const fileId = await uploadFile(proc.url, prompts.jsonl);
    const { id } = await createRun(proc.url, { model: 'm-drain', input: { file_id: fileId }, regenerate: 'last_assistant', shard_size: DRAINED / 4 });
    const url = proc.url;
    await waitFor('requests in flight', async () => {
      const run = await getRun(url, id);
      return doneOf(run) >= 40 && run.request_counts.in_progress > 0 ? run : undefined;
    });
    expect((await s.stats()).running).toBeGreaterThan(0);
    expect(await proc.kill('SIGTERM')).toBe(0);
    const stats = await s.stats();
    // What was in flight finished rather than being cut off.
    expect(stats.aborted).toBe(0);
    expect(stats.running).toBe(0);
    expect(proc.output()).toContain('regen stopped');

    // The stopped process left no lease behind, and recorded every answer it was given.
    const left = await checkDatabase(data.dir, id);
    expect(left.in_progress).toBe(0);
    expect(left.completed).toBe(stats.completed);

    // The rest need not be slow: the restart proves what it sends, not how fast.
    await s.configure({ ttftMs: 5 });
    proc = await spawnServer(data.dir, { REGEN_SHUTDOWN_GRACE_MS: '15000' });
    const done = await waitForStatus(proc.url, id, TERMINAL);
    expect(done.status).toBe('completed');
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    expect(out.lines.size).toBe(DRAINED);
    // Each prompt was sent exactly once across both processes.
    expect((await s.stats()).requests).toBe(DRAINED);
    expect([...out.lines.values()].every((l) => l.attempts === 1)).toBe(true);
    await expectCountersMatchRecount(proc.url, done);
    await proc.kill('SIGTERM');
  });

  it('exits at once on a second signal, leaving consistent leases that a restart recovers', async () => {
    const s = await sim({ model: 'm-twice', 'max-running': 16, 'ttft-ms': 100 });
    const dir = tempDir('regen-twice-');
    try {
      proc = await spawnServer(dir.dir, { REGEN_SHUTDOWN_GRACE_MS: '30000' });
      await registerEndpoint(proc.url, s.url);
      const prompts = makePrompts(200, 'twice');
      const fileId = await uploadFile(proc.url, prompts.jsonl);
      const { id } = await createRun(proc.url, { model: 'm-twice', input: { file_id: fileId }, regenerate: 'last_assistant', shard_size: 50 });
      await waitForDone(proc.url, id, 30);
      // Requests now take far longer than the test waits, so the drain cannot finish by itself.
      const before = (await s.stats()).requests;
      await s.configure({ ttftMs: 20_000 });
      await waitFor('slow requests in flight', async () => ((await s.stats()).requests >= before + 16 ? true : undefined));
      const exited = once(proc.proc, 'exit');
      proc.proc.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 500));
      expect(proc.proc.exitCode).toBeNull();
      const t0 = Date.now();
      proc.proc.kill('SIGINT');
      const [code] = await exited;
      expect(code).toBe(130);
      expect(Date.now() - t0).toBeLessThan(5000);

      // The leases stay for recovery; the counters still agree with the samples.
      expect((await checkDatabase(dir.dir, id)).in_progress).toBeGreaterThan(0);

      await s.configure({ ttftMs: 100 });
      proc = await spawnServer(dir.dir);
      const done = await waitForStatus(proc.url, id, TERMINAL);
      expect(done.status).toBe('completed');
      const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
      expect(out.lines.size).toBe(200);
      expect([...out.lines.values()].every((l) => l.attempts === 1)).toBe(true);
      await expectCountersMatchRecount(proc.url, done);
      await proc.kill('SIGTERM');
    } finally {
      dir.cleanup();
    }
  });
});
