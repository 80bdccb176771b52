import pg from 'pg';
import { afterAll, expect, it } from 'vitest';
import { REPLICA_STALE_MS } from '../src/db/replicas.js';
import type { SimProcess } from '../src/sim/spawn.js';
import { since } from './support/faults.js';
import { doneOf, faultRig, readOutput, s3ServerEnv, waitForEnd, waitForRun } from './support/fault-rig.js';
import { createTestDatabase, describePg, type TestDatabase } from './support/pg.js';
import { createRun, expectCountersMatchRecount, getRun, makePrompts, registerEndpoint, uploadFile } from './support/runner-checks.js';
import { call, waitFor, type ServerProcess } from './support/server.js';

// `regen serve` processes on one PostgreSQL database and one S3 store. Each serves the whole API
// and dispatches to the endpoints it drives, one replica per endpoint; the one holding the runner
// lock also coordinates. The others take a dead one's endpoints, leases and coordination over.

const BUCKET = 'regen-replicas';
const SAMPLES = 3000;
const SHARD_SIZE = 200;
/** Below the simulator's own running limit: a second driver of an endpoint at any moment would show as more running at once. */
const CAP = 6;

const rig = faultRig();
const databases: TestDatabase[] = [];
afterAll(async () => {
  await rig.stop();
  for (const d of databases) await d.drop();
});

/** The runner role a replica's /metrics names for itself. */
async function roleOf(base: string): Promise<string | undefined> {
  const text = await (await fetch(`${base}/metrics`)).text();
  return /^regen_replica_info\{[^}]*role="(\w+)"[^}]*\} 1$/m.exec(text)?.[1];
}

async function newDatabase(name: string): Promise<TestDatabase> {
  const d = await createTestDatabase(name);
  databases.push(d);
  return d;
}

async function query<R extends pg.QueryResultRow>(url: string, text: string): Promise<R[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<R>(text)).rows;
  } finally {
    await client.end();
  }
}

/** The pid of the process that holds the runner lock now: the coordinating replica. */
async function coordinatorPid(url: string): Promise<number | null> {
  return (await query<{ pid: number }>(url, 'select pid from runner_lock where id = 1'))[0]?.pid ?? null;
}

/** The pid of the replica driving each endpoint, by the endpoint's URL. */
async function driverPids(url: string): Promise<Map<string, number>> {
  const rows = await query<{ url: string; pid: number }>(
    url,
    'select e.url, r.pid from endpoint_drivers d join endpoints e on e.id = d.endpoint_id join replicas r on r.owner = d.owner',
  );
  return new Map(rows.map((r) => [r.url, r.pid]));
}

const alive = (r: ServerProcess) => r.proc.exitCode === null && r.proc.signalCode === null;

/** Waits until each of `endpoints` is driven by one of `replicas`, and each of those drives one at least. */
async function waitForSpread(dbUrl: string, endpoints: string[], replicas: ServerProcess[], what: string): Promise<Map<string, number>> {
  const pids = new Set(replicas.map((r) => r.proc.pid));
  return waitFor(
    what,
    async () => {
      const drivers = await driverPids(dbUrl);
      const driving = new Set(drivers.values());
      const spread = endpoints.every((u) => pids.has(drivers.get(u) ?? -1)) && [...pids].every((p) => driving.has(p!) || endpoints.length < pids.size);
      return spread ? drivers : undefined;
    },
    30_000,
    100,
  );
}

await describePg('three replicas on one PostgreSQL', () => {
  it('share the API and the fleet, one replica per endpoint, and kills -9 of two of them, one after the other, lose and duplicate nothing', async () => {
    const database = await newDatabase('replicas');
    const s3 = await rig.startS3(BUCKET);
    const sims: SimProcess[] = [];
    for (const seed of [5, 6, 7]) sims.push(await rig.sim({ 'max-running': 64, 'ttft-ms': 20, 'tokens-per-second': 5000, seed }));
    const env = { ...s3ServerEnv(`http://127.0.0.1:${s3.port}`, BUCKET), REGEN_DATABASE_URL: database.url };
    const replicas: ServerProcess[] = [];
    for (const name of ['a', 'b', 'c']) replicas.push(await rig.serve(rig.dir(`regen-replica-${name}-`), env));
    const [a, b, c] = replicas;

    // Upload through one replica, register the endpoints and create the run through another, follow it on the third.
    const prompts = makePrompts(SAMPLES, 'rep');
    const fileId = await uploadFile(a.url, prompts.jsonl);
    for (const sim of sims) await registerEndpoint(b.url, sim.url, { max_concurrency: CAP });
    const { id } = await createRun(b.url, { model: 'sim-model', input: { file_id: fileId }, shard_size: SHARD_SIZE, regenerate: 'last_assistant' });
    const moving = await waitForRun(c.url, id, 'progress seen from the third replica', (r) => doneOf(r) > 0 && r.progress.samples_per_second > 0, 60_000, 50);
    expect(moving.status).toBe('in_progress');

    // Each replica drives one endpoint, and each endpoint answers; one replica also coordinates.
    const urls = sims.map((s) => s.url);
    const spread = await waitForSpread(database.url, urls, replicas, 'each replica to drive one endpoint');
    expect(new Set(spread.values()).size).toBe(3);
    const before = await Promise.all(sims.map((s) => s.stats()));
    await waitFor(
      'every endpoint to answer',
      async () => ((await Promise.all(sims.map((s) => s.stats()))).every((st, i) => st.completed > before[i].completed) ? true : undefined),
      30_000,
      50,
    );
    const roles = await Promise.all(replicas.map((r) => roleOf(r.url)));
    expect(roles.sort()).toEqual(['coordinating', 'dispatching', 'dispatching']);
    // The fleet's rate from any replica: all three endpoints' answers, summed from their drivers' views.
    const endpointsSeen = (await call(a.url, '/v1/endpoints')).body.data as { live: { in_flight: number } }[];
    expect(endpointsSeen).toHaveLength(3);

    const kills: { role: string; at: number; takeoverMs: number }[] = [];
    const kill = async (fraction: number, role: 'dispatching' | 'coordinating') => {
      await waitForRun(c.url, id, `${fraction * 100}% done`, (r) => doneOf(r) >= fraction * SAMPLES, 120_000, 50);
      const coordinator = await coordinatorPid(database.url);
      const victim = replicas.find((r) => alive(r) && (role === 'coordinating') === (r.proc.pid === coordinator));
      expect(victim, `a live ${role} replica`).toBeDefined();
      await victim!.kill('SIGKILL');
      const t0 = performance.now();
      const left = replicas.filter(alive);
      // What was committed at the kill; then the dead one's endpoint is driven by a live replica, and the run moves past it.
      const atKill = doneOf(await getRun(left[0].url, id));
      await waitForSpread(database.url, urls, left, "the dead replica's endpoint to be driven again");
      await waitForRun(left[0].url, id, 'progress after the kill', (r) => doneOf(r) > atKill + 3 * CAP || r.status === 'completed', 60_000, 50);
      kills.push({ role, at: atKill, takeoverMs: Math.round(since(t0)) });
      return left;
    };
    await kill(0.3, 'dispatching');
    const [last] = await kill(0.65, 'coordinating');
    expect(await roleOf(last.url)).toBe('coordinating');

    const done = await waitForEnd(last.url, id, 180_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    await expectCountersMatchRecount(last.url, done);
    // Every prompt once, with its own answer, in shards the manifest describes.
    const out = await readOutput(done, prompts, `http://127.0.0.1:${s3.port}`);
    expect(out.lines.size).toBe(SAMPLES);
    // One driver per endpoint at a time: no endpoint ever ran more than its cap at once.
    const stats = await Promise.all(sims.map((s) => s.stats()));
    for (const st of stats) expect(st.maxRunningSeen).toBeLessThanOrEqual(CAP);
    // The last replica drives all three.
    expect(new Set((await driverPids(database.url)).values())).toEqual(new Set([last.proc.pid]));
    console.log(
      `replicas: ${JSON.stringify({ samples: SAMPLES, kills, answered: stats.map((st) => st.completed), max_running_seen: stats.map((st) => st.maxRunningSeen), cap: CAP })}`,
    );
  }, 300_000);

  it('a coordinator stalled past its heartbeat is replaced, its endpoint driven by the other; woken, it stops, rejoins, and takes over again', async () => {
    const database = await newDatabase('replica-stall');
    const s3 = rig.s3 ?? (await rig.startS3(BUCKET));
    // Slow enough that the run is far from done after the stall: about 100 answers a second at each cap.
    const sims: SimProcess[] = [];
    for (const seed of [7, 8]) sims.push(await rig.sim({ 'max-running': 64, 'ttft-ms': 50, 'tokens-per-second': 2000, seed }));
    const urls = sims.map((s) => s.url);
    const env = { ...s3ServerEnv(`http://127.0.0.1:${s3.port}`, BUCKET), REGEN_DATABASE_URL: database.url };
    const a = await rig.serve(rig.dir('regen-stall-a-'), env);
    const b = await rig.serve(rig.dir('regen-stall-b-'), env);
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

    // And it can coordinate again: the other dies, the rejoined one takes over and finishes.
    await second.kill('SIGKILL');
    const done = await waitForEnd(first.url, id, 180_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(await coordinatorPid(database.url)).toBe(first.proc.pid);
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    await expectCountersMatchRecount(first.url, done);
    const out = await readOutput(done, prompts, `http://127.0.0.1:${s3.port}`);
    expect(out.lines.size).toBe(SAMPLES);
    const peaks = (await Promise.all(sims.map((s) => s.stats()))).map((st) => st.maxRunningSeen);
    for (const peak of peaks) expect(peak).toBeLessThanOrEqual(CAP);
    console.log(`replica stall: ${JSON.stringify({ takeover_ms: takeoverMs, max_running_seen: peaks })}`);
  }, 300_000);

  it('two runs for different models share the fleet by priority, through a takeover; a replica restarted on the database rejoins and serves them', async () => {
    const database = await newDatabase('replica-priority');
    const s3 = rig.s3 ?? (await rig.startS3(BUCKET));
    const sims = [
      await rig.sim({ 'max-running': 64, 'ttft-ms': 30, 'tokens-per-second': 3000, seed: 21 }),
      await rig.sim({ 'max-running': 64, 'ttft-ms': 30, 'tokens-per-second': 3000, seed: 22 }),
    ];
    const env = { ...s3ServerEnv(`http://127.0.0.1:${s3.port}`, BUCKET), REGEN_DATABASE_URL: database.url };
    const dirs = ['a', 'b', 'c'].map((name) => rig.dir(`regen-priority-${name}-`));
    const replicas: ServerProcess[] = [];
    for (const dir of dirs) replicas.push(await rig.serve(dir, env));
    const [a, b] = replicas;
    // Both endpoints serve both models (a second served name), so the runs want the same slots.
    for (const sim of sims) await registerEndpoint(a.url, sim.url, { max_concurrency: CAP, aliases: ['other-model'] });
    const SLOTS = CAP * sims.length;

    // The low-priority run first, through one replica; the high-priority one once it is under way, through another.
    const low = makePrompts(2400, 'low');
    const high = makePrompts(900, 'high');
    const lowRun = await createRun(a.url, {
      model: 'sim-model',
      input: { file_id: await uploadFile(a.url, low.jsonl) },
      shard_size: SHARD_SIZE,
      regenerate: 'last_assistant',
    });
    await waitForRun(b.url, lowRun.id, 'the low-priority run 10% done', (r) => doneOf(r) >= 0.1 * 2400, 120_000, 50);
    const highRun = await createRun(b.url, {
      model: 'other-model',
      priority: 10,
      input: { file_id: await uploadFile(b.url, high.jsonl) },
      shard_size: SHARD_SIZE,
      regenerate: 'last_assistant',
    });

    // Followed on another replica: what the low run completes while the high one is dispatched.
    const pid = await coordinatorPid(database.url);
    const first = replicas.find((r) => r.proc.pid === pid)!;
    expect(first, 'a replica coordinates').toBeDefined();
    const follower = replicas.find((r) => r !== first)!;
    let lowAtHighStart: number | null = null;
    let lowAtHighAnswered: number | null = null;
    let killed = false;
    const highDone = await waitFor(
      'the high-priority run to complete',
      async () => {
        const [l, h] = await Promise.all([getRun(follower.url, lowRun.id), getRun(follower.url, highRun.id)]);
        if (lowAtHighStart === null && h.status !== 'validating' && h.status !== 'queued') lowAtHighStart = l.request_counts.completed;
        if (lowAtHighAnswered === null && doneOf(h) === 900) lowAtHighAnswered = l.request_counts.completed;
        if (!killed && doneOf(h) >= 0.3 * 900) {
          // The coordinator dies with samples of both runs claimed: the replica taking its endpoint claims by priority again.
          killed = true;
          await first.kill('SIGKILL');
        }
        return h.status === 'completed' ? { l, h } : undefined;
      },
      180_000,
      50,
    );
    expect(lowAtHighStart, 'the high-priority run was seen under way').not.toBeNull();
    expect(highDone.l.status, 'the low-priority run is still under way when the high one ends').toBe('in_progress');
    // While the high run is answered, the low one gets only what it had in flight or claimed ahead
    // when the high one arrived or a replica took the dead one's endpoint (a claim of its slots each
    // time), and the slots its last samples leave: a few dozen. Sharing the slots it would get
    // about as many as the high run's 900; served by age, all of them.
    const lowMeanwhile = lowAtHighAnswered! - lowAtHighStart!;
    expect(lowMeanwhile).toBeLessThanOrEqual(0.15 * 900);

    // The killed replica, restarted on the same database and folder, rejoins and serves both runs.
    expect(killed, 'the coordinator was killed mid-run').toBe(true);
    const restarted = await rig.serve(dirs[replicas.indexOf(first)], env);
    await waitFor('the restarted replica to dispatch', async () => ((await roleOf(restarted.url)) === 'dispatching' ? true : undefined), 30_000, 100);
    expect((await getRun(restarted.url, highRun.id)).status).toBe('completed');
    const lowDone = await waitForEnd(restarted.url, lowRun.id, 180_000);
    expect(lowDone.status, lowDone.status_reason).toBe('completed');
    for (const [run, prompts, n] of [
      [lowDone, low, 2400],
      [highDone.h, high, 900],
    ] as const) {
      expect(run.request_counts).toMatchObject({ total: n, completed: n, failed: 0 });
      await expectCountersMatchRecount(follower.url, run);
      expect((await readOutput(run, prompts, `http://127.0.0.1:${s3.port}`)).lines.size).toBe(n);
    }
    for (const sim of sims) expect((await sim.stats()).maxRunningSeen).toBeLessThanOrEqual(CAP);
    console.log(
      `replica priority: ${JSON.stringify({ low_meanwhile: lowMeanwhile, slots: SLOTS, high: 900, low_after: highDone.l.request_counts.completed - lowAtHighStart! })}`,
    );
  }, 300_000);

  it('an endpoint driven alone by one replica is judged against the peers another drives: the broken one is quarantined', async () => {
    const database = await newDatabase('replica-quality');
    const s3 = rig.s3 ?? (await rig.startS3(BUCKET));
    const good = await rig.sim({ 'max-running': 16, 'ttft-ms': 20, 'tokens-per-second': 4000, seed: 31 });
    const bad = await rig.sim({ 'max-running': 16, 'ttft-ms': 20, 'tokens-per-second': 4000, 'degenerate-rate': 0.87, seed: 32 });
    const env = { ...s3ServerEnv(`http://127.0.0.1:${s3.port}`, BUCKET), REGEN_DATABASE_URL: database.url };
    const a = await rig.serve(rig.dir('regen-quality-a-'), env);
    const b = await rig.serve(rig.dir('regen-quality-b-'), env);
    await registerEndpoint(a.url, good.url);
    const badEp = await registerEndpoint(a.url, bad.url);
    // One endpoint each: each replica sees only its own endpoint's answers.
    await waitForSpread(database.url, [good.url, bad.url], [a, b], 'each replica to drive one endpoint');
    const prompts = makePrompts(2000, 'quality');
    const { id } = await createRun(b.url, {
      model: 'sim-model',
      input: { file_id: await uploadFile(b.url, prompts.jsonl) },
      shard_size: SHARD_SIZE,
      regenerate: 'last_assistant',
      params: { chat_template_kwargs: { enable_thinking: true } },
      // Half the answers come from the broken server until it is out: a run-wide limit above that
      // share leaves the verdict to the quarantine, which is what this test is about.
      quality: { gate: { max_flag_rate: 0.5 } },
    });
    const done = await waitForEnd(a.url, id, 180_000);
    expect(done.status, done.status_reason).toBe('completed');
    const ep = (await call(b.url, `/v1/endpoints/${badEp.id}`)).body;
    expect(ep.state).toBe('quarantined');
    expect(ep.last_error).toMatch(/^quality gate: endpoint /);
    // Out within seconds: the peers' counts reach it with the views, once a second. Left in, it
    // would answer about half of the 2,000 and more (its flagged answers asked again).
    const answeredByBad = (await bad.stats()).completed;
    expect(answeredByBad).toBeLessThan(600);
    const out = await readOutput(done, prompts, `http://127.0.0.1:${s3.port}`);
    expect(out.lines.size).toBe(2000);
    const flagged = [...out.lines.values()].filter((l) => l.flags.length > 0).length;
    expect(flagged / out.lines.size).toBeLessThan(0.01);
    console.log(`replica quality: ${JSON.stringify({ answers_from_the_broken_one: answeredByBad, flagged_in_output: flagged })}`);
  }, 300_000);

  it('a replica stopped while its requests run past the heartbeat staleness keeps its endpoint and leases until they end: nothing is sent twice, no endpoint runs past its cap', async () => {
    const database = await newDatabase('replica-drain');
    const s3 = rig.s3 ?? (await rig.startS3(BUCKET));
    // Each answer takes 18 s: longer than a replica's heartbeat may be silent (15 s) before it is taken for dead.
    const sims: SimProcess[] = [];
    for (const seed of [41, 42]) sims.push(await rig.sim({ 'max-running': 64, 'ttft-ms': 18_000, 'tokens-per-second': 5000, seed }));
    const urls = sims.map((s) => s.url);
    const env = { ...s3ServerEnv(`http://127.0.0.1:${s3.port}`, BUCKET), REGEN_DATABASE_URL: database.url, REGEN_SHUTDOWN_GRACE_MS: '60000' };
    const a = await rig.serve(rig.dir('regen-drain-a-'), env);
    const b = await rig.serve(rig.dir('regen-drain-b-'), env);
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
        return since(t0) > REPLICA_STALE_MS ? true : undefined;
      },
      30_000,
      200,
    );
    expect([...seen]).toEqual([`draining, drivers ${[a.proc.pid, b.proc.pid].sort().join(' ')}`]);
    expect(await exited).toBe(0);
    const drainMs = Math.round(since(t0));

    const done = await waitForEnd(staying.url, id, 120_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: n, completed: n, failed: 0 });
    await expectCountersMatchRecount(staying.url, done);
    expect((await readOutput(done, prompts, `http://127.0.0.1:${s3.port}`)).lines.size).toBe(n);
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
