import Database from 'better-sqlite3';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { Stores } from '../src/storage/index.js';
import { since } from './support/faults.js';
import { spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { checkOutput, createRun, expectCountersMatchRecount, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// SIGTERM while hundreds of slow requests are in flight: every one of them must be answered and
// committed within the grace period, the process must exit 0, and a restart must send each of the
// remaining prompts once: no prompt lost, none asked twice.

const SAMPLES = 1200;
const GRACE_MS = 15_000;
const MODEL = 'm-sigterm';

const data = tempDir('regen-fault-sigterm-');
const sims: SimProcess[] = [];
let server: ServerProcess | null = null;

afterAll(async () => {
  await server?.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  data.cleanup();
});

describe('SIGTERM with hundreds of requests in flight', () => {
  it('drains them all, exits 0 within the grace period, and a restart finishes with nothing lost or duplicated', async () => {
    // About 2 s a request, 200 at once on each server: max_concurrency comes from /get_server_info.
    for (const seed of [1, 2]) sims.push(await spawnSimulator({ model: MODEL, 'max-running': 200, 'ttft-ms': 2000, 'tokens-per-second': 10_000, seed }));
    server = await spawnServer(data.dir, { REGEN_SHUTDOWN_GRACE_MS: String(GRACE_MS) });
    for (const s of sims) await registerEndpoint(server.url, s.url);
    const prompts = makePrompts(SAMPLES, 'st');
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const { id } = await createRun(server.url, { model: MODEL, input: { file_id: fileId }, shard_size: 100, regenerate: 'last_assistant' });

    const running = async () => (await Promise.all(sims.map((s) => s.stats()))).reduce((t, s) => t + s.running, 0);
    const inFlight = await waitFor('hundreds of requests in flight', async () => {
      const n = await running();
      return n >= 300 ? n : undefined;
    }, 60_000, 50);

    const t0 = performance.now();
    const code = await server.kill('SIGTERM');
    const exitMs = since(t0);
    expect(code).toBe(0);
    expect(exitMs).toBeLessThan(GRACE_MS + 5000);
    expect(server.output()).toContain('regen stopped');
    const stats = await Promise.all(sims.map((s) => s.stats()));
    // Nothing was cut off: every request in flight at the signal was answered.
    expect(stats.reduce((t, s) => t + s.aborted, 0)).toBe(0);
    expect(stats.reduce((t, s) => t + s.running, 0)).toBe(0);
    const answered = stats.reduce((t, s) => t + s.completed, 0);

    // Every answer is committed, nothing is leased, the counters match the rows.
    const db = new Database(join(data.dir, 'regen.db'), { readonly: true });
    const counts = db.prepare(`select status, count(*) n, count(lease_owner) leased from samples where run_id = ? group by status`).all(id) as any[];
    const row = db.prepare(`select pending, in_progress, completed from runs where id = ?`).get(id) as any;
    db.close();
    const n = (st: string) => counts.find((c) => c.status === st)?.n ?? 0;
    expect(counts.every((c) => c.leased === 0)).toBe(true);
    expect(row).toEqual({ pending: n('pending'), in_progress: 0, completed: n('completed') });
    expect(n('completed')).toBe(answered);
    expect(n('pending')).toBeGreaterThan(0);

    const t1 = performance.now();
    server = await spawnServer(data.dir, { REGEN_SHUTDOWN_GRACE_MS: String(GRACE_MS) });
    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled']);
    const finishMs = since(t1);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    const stores = new Stores({ forcePathStyle: false });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    // Each prompt was sent exactly once across both processes.
    const requests = (await Promise.all(sims.map((s) => s.stats()))).reduce((t, s) => t + s.requests, 0);
    expect(requests).toBe(SAMPLES);
    expect([...out.lines.values()].every((l) => l.attempts === 1)).toBe(true);
    await expectCountersMatchRecount(server.url, done);
    expect(await server.kill('SIGTERM')).toBe(0);
    console.log('fault-sigterm:', JSON.stringify({ samples: SAMPLES, in_flight_at_signal: inFlight, drained_answers: answered, exit_ms: exitMs, grace_ms: GRACE_MS, restart_to_completed_ms: finishMs }));
  });
});
