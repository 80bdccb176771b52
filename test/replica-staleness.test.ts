import { afterAll, expect, it } from 'vitest';
import { since } from './support/faults.js';
import { doneOf, faultRig, readOutput, waitForEnd, waitForRun } from './support/fault-rig.js';
import { describePg } from './support/pg.js';
import {
  alive,
  coordinatorPid,
  driverPids,
  replicaDatabases,
  replicaDirs,
  replicaEnv,
  roleOf,
  serveReplicas,
  startSims,
  waitForSpread,
} from './support/replicas.js';
import { createRun, expectCountersMatchRecount, getRun, makePrompts, registerEndpoint, uploadFile } from './support/runner-checks.js';
import { waitFor } from './support/server.js';

// Replicas of `regen serve` on one PostgreSQL database (test/replicas.test.ts), judged by their
// heartbeats: one that stops beating is taken for dead once its last heartbeat is
// REGEN_REPLICA_STALE_MS old, and one that beats on keeps what it has however long that takes.

const SHARD_SIZE = 200;
/** Below the simulator's own running limit: a second driver of an endpoint at any moment would show as more running at once. */
const CAP = 6;
/** The staleness the replicas here judge each other by: the least REGEN_REPLICA_STALE_MS takes, so a stall is seen in seconds. */
const STALE_MS = 6000;
/**
 * How long an answer takes in the drain test: past the staleness, with room for the moments
 * between the answers' start and the replica's stop, which a loaded machine stretches.
 */
const PAST_STALE_MS = STALE_MS + 4000;

const rig = faultRig();
const databases = replicaDatabases();
afterAll(async () => {
  await rig.stop();
  await databases.drop();
});

const s3Endpoint = () => `http://127.0.0.1:${rig.s3!.port}`;

await describePg('replicas judged by their heartbeats, on one PostgreSQL', () => {
  it('a coordinator stalled past its heartbeat is replaced, its endpoint driven by the other; woken, it stops, rejoins, and takes over again', async () => {
    const database = await databases.create('replica-stall', { migrated: true });
    const env = await replicaEnv(rig, database, { REGEN_REPLICA_STALE_MS: String(STALE_MS) });
    // Slow enough that the run is far from done after the stall: about 14 answers a second at each
    // cap, so the 600 samples take 20 s at least, the stall and the rejoin about 10 s. The
    // simulators' pace, not the machine's, bounds how far the run gets meanwhile.
    const SAMPLES = 600;
    const sims = await startSims(
      rig,
      [7, 8].map((seed) => ({ 'max-running': 64, 'ttft-ms': 400, 'tokens-per-second': 2000, seed })),
    );
    const urls = sims.map((s) => s.url);
    const [a, b] = await serveReplicas(rig, replicaDirs(rig, 'regen-stall', ['a', 'b']), env);
    const prompts = makePrompts(SAMPLES, 'stall');
    for (const url of urls) await registerEndpoint(a.url, url, { max_concurrency: CAP });
    const { id } = await createRun(a.url, {
      model: 'sim-model',
      input: { file_id: await uploadFile(a.url, prompts.jsonl) },
      shard_size: SHARD_SIZE,
      regenerate: 'last_assistant',
    });
    await waitForRun(a.url, id, '10% done', (r) => doneOf(r) >= 0.1 * SAMPLES, 120_000, 50);
    await waitForSpread(database.url, urls, [a, b], 'each replica to drive one endpoint');
    const first = (await coordinatorPid(database.url)) === a.proc.pid ? a : b;
    const second = first === a ? b : a;

    // Stalled, not dead: its pid lives, so only its heartbeats going stale let the other take over.
    first.proc.kill('SIGSTOP');
    const t0 = performance.now();
    await waitFor('the other replica to take the lock', async () => ((await coordinatorPid(database.url)) === second.proc.pid ? true : undefined), 60_000, 100);
    const takeoverMs = since(t0);
    await waitForSpread(database.url, urls, [second], 'the other replica to drive both endpoints');
    const atTakeover = doneOf(await getRun(second.url, id));
    await waitForRun(second.url, id, 'progress without the stalled replica', (r) => doneOf(r) > atTakeover + 3 * CAP, 60_000, 50);
    expect(second.output()).toContain('a replica stopped beating: its endpoints and leases go to the others');

    // Woken, it finds the lock gone at its next tick, stops, and joins again as a new replica with an endpoint of its own.
    first.proc.kill('SIGCONT');
    await waitFor('the woken replica to stop', () => (/dispatch stops/.test(first.output()) ? true : undefined), 30_000, 50);
    await waitForSpread(database.url, urls, [first, second], 'the woken replica to drive an endpoint again');
    expect(await roleOf(first.url)).toBe('dispatching');
    expect(await roleOf(second.url)).toBe('coordinating');
    expect(doneOf(await getRun(first.url, id)), 'the run is still under way').toBeLessThan(SAMPLES);

    // And it can coordinate again: the other dies, the rejoined one takes over and finishes, its
    // pace no longer part of what is shown: answered quickly from here.
    await Promise.all(sims.map((sim) => sim.configure({ ttftMs: 5, tokensPerSecond: 20_000 })));
    await second.kill('SIGKILL');
    const done = await waitForEnd(first.url, id, 180_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(await coordinatorPid(database.url)).toBe(first.proc.pid);
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    await expectCountersMatchRecount(first.url, done);
    const out = await readOutput(done, prompts, s3Endpoint());
    expect(out.lines.size).toBe(SAMPLES);
    const peaks = (await Promise.all(sims.map((s) => s.stats()))).map((st) => st.maxRunningSeen);
    for (const peak of peaks) expect(peak).toBeLessThanOrEqual(CAP);
    console.log(`replica stall: ${JSON.stringify({ takeover_ms: takeoverMs, max_running_seen: peaks })}`);
  }, 300_000);

  it('a replica stopped while its requests run past the heartbeat staleness keeps its endpoint and leases until they end: nothing is sent twice, no endpoint runs past its cap', async () => {
    const database = await databases.create('replica-drain', { migrated: true });
    const env = await replicaEnv(rig, database, { REGEN_REPLICA_STALE_MS: String(STALE_MS), REGEN_SHUTDOWN_GRACE_MS: '60000' });
    // Each answer takes longer than a replica's heartbeat may be silent before it is taken for dead.
    const sims = await startSims(
      rig,
      [41, 42].map((seed) => ({ 'max-running': 64, 'ttft-ms': PAST_STALE_MS, 'tokens-per-second': 5000, seed })),
    );
    const urls = sims.map((s) => s.url);
    const [a, b] = await serveReplicas(rig, replicaDirs(rig, 'regen-drain', ['a', 'b']), env);
    for (const url of urls) await registerEndpoint(a.url, url, { max_concurrency: CAP });
    await waitForSpread(database.url, urls, [a, b], 'each replica to drive one endpoint');
    const n = 4 * CAP;
    const prompts = makePrompts(n, 'drain');
    const { id } = await createRun(a.url, {
      model: 'sim-model',
      input: { file_id: await uploadFile(a.url, prompts.jsonl) },
      shard_size: CAP,
      regenerate: 'last_assistant',
    });
    await waitFor(
      'both endpoints full',
      async () => ((await Promise.all(sims.map((s) => s.stats()))).every((st) => st.running === CAP) ? true : undefined),
      30_000,
      50,
    );
    // The replica that only dispatches stops; the coordinator would take it for dead if it stopped beating.
    const coordinator = await coordinatorPid(database.url);
    const leaving = coordinator === a.proc.pid ? b : a;
    const staying = leaving === a ? b : a;
    const t0 = performance.now();
    const exited = leaving.kill('SIGTERM');
    // Its requests still run past the staleness: draining all along, its endpoint stays its own.
    const seen = new Set<string>();
    await waitFor(
      'the heartbeat staleness to pass while the replica drains',
      async () => {
        const drivers = [...new Set((await driverPids(database.url)).values())].sort();
        seen.add(`${alive(leaving) ? 'draining' : 'exited'}, drivers ${drivers.join(' ')}`);
        return since(t0) > STALE_MS ? true : undefined;
      },
      30_000,
      200,
    );
    expect([...seen]).toEqual([`draining, drivers ${[a.proc.pid, b.proc.pid].sort().join(' ')}`]);
    // The answers still running were sent before the staleness passed; the rest of the run, the
    // stopped replica's endpoint driven by the other, need not wait as long.
    await Promise.all(sims.map((sim) => sim.configure({ ttftMs: 20 })));
    expect(await exited).toBe(0);
    const drainMs = Math.round(since(t0));

    const done = await waitForEnd(staying.url, id, 120_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: n, completed: n, failed: 0 });
    await expectCountersMatchRecount(staying.url, done);
    expect((await readOutput(done, prompts, s3Endpoint())).lines.size).toBe(n);
    const stats = await Promise.all(sims.map((s) => s.stats()));
    // Each prompt asked once: nothing given back and sent again while its first request ran.
    expect(stats.reduce((sum, st) => sum + st.requests, 0)).toBe(n);
    for (const st of stats) expect(st.maxRunningSeen).toBeLessThanOrEqual(CAP);
    expect(staying.output()).not.toContain('a replica stopped beating');
    console.log(
      `replica drain: ${JSON.stringify({ drain_ms: drainMs, requests: stats.map((st) => st.requests), max_running_seen: stats.map((st) => st.maxRunningSeen) })}`,
    );
  }, 300_000);
});
