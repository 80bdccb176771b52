import { describe, expect, it } from 'vitest';
import { since } from './support/faults.js';
import { faultRig, preparePrompts, readOutput, simTotals, SLOW_SIM, waitForEnd } from './support/fault-rig.js';
import { waitFor, type ServerProcess } from './support/server.js';
import { openTestStore } from './support/store.js';
import { createRun, expectCountersMatchRecount } from './support/runner-checks.js';

// SIGTERM while hundreds of slow requests are in flight: every one of them must be answered and
// committed within the grace period, the process must exit 0, and a restart must send each of the
// remaining prompts once: no prompt lost, none asked twice.

const SAMPLES = 1200;
const GRACE_MS = 15_000;
const MODEL = 'm-sigterm';

const rig = faultRig();

describe('SIGTERM with hundreds of requests in flight', () => {
  it('drains them all, exits 0 within the grace period, and a restart finishes with nothing lost or duplicated', async () => {
    const data = rig.dir('regen-fault-sigterm-');
    // max_concurrency comes from /get_server_info. Answers of 5 s: regen has hundreds in flight even
    // when a loaded machine slows its dispatch (at 2 s, a machine at load 13 never had 300 out at once).
    for (const seed of [1, 2]) await rig.sim({ model: MODEL, ...SLOW_SIM, 'ttft-ms': 5000, seed });
    let server: ServerProcess = await rig.serve(data, { REGEN_SHUTDOWN_GRACE_MS: String(GRACE_MS) });
    const { prompts, fileId } = await preparePrompts(server.url, rig.sims, SAMPLES, 'st');
    const { id } = await createRun(server.url, { model: MODEL, input: { file_id: fileId }, shard_size: 100, regenerate: 'last_assistant' });

    const inFlight = await waitFor(
      'hundreds of requests in flight',
      async () => {
        const n = (await simTotals(rig.sims)).running;
        return n >= 300 ? n : undefined;
      },
      60_000,
      50,
    );

    const t0 = performance.now();
    const code = await server.kill('SIGTERM');
    const exitMs = since(t0);
    expect(code).toBe(0);
    expect(exitMs).toBeLessThan(GRACE_MS + 5000);
    expect(server.output()).toContain('regen stopped');
    const stats = await simTotals(rig.sims);
    // Nothing was cut off: every request in flight at the signal was answered.
    expect(stats.aborted).toBe(0);
    expect(stats.running).toBe(0);
    const answered = stats.completed;

    // Every answer is committed, nothing is leased, the counters match the rows.
    const db = await openTestStore(data);
    const { rows: counts } = await db.exec<any>(`select status, count(*) as n, count(lease_owner) as leased from samples where run_id = ? group by status`, [
      id,
    ]);
    const [row] = (await db.exec<any>(`select pending, in_progress, completed from runs where id = ?`, [id])).rows;
    await db.close();
    const n = (st: string) => counts.find((c) => c.status === st)?.n ?? 0;
    expect(counts.every((c) => c.leased === 0)).toBe(true);
    expect(row).toEqual({ pending: n('pending'), in_progress: 0, completed: n('completed') });
    expect(n('completed')).toBe(answered);
    expect(n('pending')).toBeGreaterThan(0);

    // The rest need not take 5 s an answer: the restart proves what it sends, not how fast.
    for (const sim of rig.sims) await sim.configure({ ttftMs: 5 });
    const t1 = performance.now();
    server = await rig.serve(data, { REGEN_SHUTDOWN_GRACE_MS: String(GRACE_MS) });
    const done = await waitForEnd(server.url, id);
    const finishMs = since(t1);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    const out = await readOutput(done, prompts);
    expect(out.lines.size).toBe(SAMPLES);
    // Each prompt was sent exactly once across both processes.
    expect((await simTotals(rig.sims)).requests).toBe(SAMPLES);
    expect([...out.lines.values()].every((l) => l.attempts === 1)).toBe(true);
    await expectCountersMatchRecount(server.url, done);
    expect(await server.kill('SIGTERM')).toBe(0);
    console.log(
      'fault-sigterm:',
      JSON.stringify({
        samples: SAMPLES,
        in_flight_at_signal: inFlight,
        drained_answers: answered,
        exit_ms: exitMs,
        grace_ms: GRACE_MS,
        restart_to_completed_ms: finishMs,
      }),
    );
  });
});
