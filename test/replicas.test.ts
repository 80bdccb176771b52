import pg from 'pg';
import { afterAll, expect, it } from 'vitest';
import { since } from './support/faults.js';
import { doneOf, faultRig, readOutput, s3ServerEnv, waitForEnd, waitForRun } from './support/fault-rig.js';
import { createTestDatabase, describePg, type TestDatabase } from './support/pg.js';
import { createRun, expectCountersMatchRecount, getRun, makePrompts, registerEndpoint, uploadFile } from './support/runner-checks.js';
import { call, waitFor, type ServerProcess } from './support/server.js';

// Three `regen serve` processes on one PostgreSQL database and one S3 store. One dispatches; the
// others serve the whole API and stand by, and take dispatch over when it dies.

const BUCKET = 'regen-replicas';
const SAMPLES = 3000;
const SHARD_SIZE = 200;
/** Below the simulator's own running limit: a second dispatcher at any moment would show as more running at once. */
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

/** The pid of the process that holds the runner lock now. */
async function dispatcherPid(url: string): Promise<number | null> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<{ pid: number }>('select pid from runner_lock where id = 1');
    return rows[0]?.pid ?? null;
  } finally {
    await client.end();
  }
}

await describePg('three replicas on one PostgreSQL', () => {
  it('share the API, and a kill -9 of the dispatching replica, twice, loses and duplicates nothing', async () => {
    const database = await newDatabase('replicas');
    const s3 = await rig.startS3(BUCKET);
    const sim = await rig.sim({ 'max-running': 64, 'ttft-ms': 20, 'tokens-per-second': 5000, seed: 5 });
    const env = { ...s3ServerEnv(`http://127.0.0.1:${s3.port}`, BUCKET), REGEN_DATABASE_URL: database.url };
    const replicas: ServerProcess[] = [];
    for (const name of ['a', 'b', 'c']) replicas.push(await rig.serve(rig.dir(`regen-replica-${name}-`), env));
    const [a, b, c] = replicas;

    // Upload through one replica, register the endpoint and create the run through another, follow it on the third.
    const prompts = makePrompts(SAMPLES, 'rep');
    const fileId = await uploadFile(a.url, prompts.jsonl);
    await registerEndpoint(b.url, sim.url, { max_concurrency: CAP });
    const { id } = await createRun(b.url, { model: 'sim-model', input: { file_id: fileId }, shard_size: SHARD_SIZE, regenerate: 'last_assistant' });
    const moving = await waitForRun(c.url, id, 'progress seen from the third replica', (r) => doneOf(r) > 0 && r.progress.samples_per_second > 0, 60_000, 50);
    expect(moving.status).toBe('in_progress');

    // One dispatches, the others say they stand by.
    const roles = await Promise.all(replicas.map((r) => roleOf(r.url)));
    expect(roles.sort()).toEqual(['dispatching', 'standby', 'standby']);
    const byPid = (pid: number | null) => replicas.find((r) => r.proc.pid === pid && r.proc.exitCode === null && r.proc.signalCode === null);
    const kills: { at: number; takeoverMs: number }[] = [];
    const killDispatcher = async (fraction: number) => {
      await waitForRun(c.url, id, `${fraction * 100}% done`, (r) => doneOf(r) >= fraction * SAMPLES, 120_000, 50);
      const dispatcher = byPid(await dispatcherPid(database.url));
      expect(dispatcher, 'a live replica holds the runner lock').toBeDefined();
      await dispatcher!.kill('SIGKILL');
      const t0 = performance.now();
      const alive = replicas.filter((r) => r !== dispatcher && r.proc.exitCode === null && r.proc.signalCode === null);
      // What the dead one had committed; then another replica takes over and the run moves past it.
      const atKill = doneOf(await getRun(alive[0].url, id));
      await waitForRun(alive[0].url, id, 'progress after the kill', (r) => doneOf(r) > atKill + CAP || r.status === 'completed', 60_000, 50);
      kills.push({ at: atKill, takeoverMs: Math.round(since(t0)) });
      return alive;
    };
    await killDispatcher(0.3);
    const [last] = await killDispatcher(0.65);

    const done = await waitForEnd(last.url, id, 180_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    await expectCountersMatchRecount(last.url, done);
    // Every prompt once, with its own answer, in shards the manifest describes.
    const out = await readOutput(done, prompts, `http://127.0.0.1:${s3.port}`);
    expect(out.lines.size).toBe(SAMPLES);
    // One dispatcher at a time: the endpoint never ran more than its cap at once.
    const stats = await sim.stats();
    expect(stats.maxRunningSeen).toBeLessThanOrEqual(CAP);
    // The surviving replica reports the endpoint as the dispatcher sees it.
    const endpoints = (await call(last.url, '/v1/endpoints')).body.data;
    expect(endpoints).toHaveLength(1);
    console.log(`replicas: ${JSON.stringify({ samples: SAMPLES, kills, max_running_seen: stats.maxRunningSeen, cap: CAP })}`);
  }, 300_000);

  it('a dispatcher stalled past the lock is replaced by a stale heartbeat, stops when it wakes, stands by, and takes over again', async () => {
    const database = await newDatabase('replica-stall');
    const s3 = rig.s3 ?? (await rig.startS3(BUCKET));
    // Slow enough that the run is far from done after the stall: about 100 answers a second at the cap.
    const sim = await rig.sim({ 'max-running': 64, 'ttft-ms': 50, 'tokens-per-second': 2000, seed: 7 });
    const env = { ...s3ServerEnv(`http://127.0.0.1:${s3.port}`, BUCKET), REGEN_DATABASE_URL: database.url };
    const a = await rig.serve(rig.dir('regen-stall-a-'), env);
    const b = await rig.serve(rig.dir('regen-stall-b-'), env);
    const prompts = makePrompts(SAMPLES, 'stall');
    await registerEndpoint(a.url, sim.url, { max_concurrency: CAP });
    const { id } = await createRun(a.url, {
      model: 'sim-model',
      input: { file_id: await uploadFile(a.url, prompts.jsonl) },
      shard_size: SHARD_SIZE,
      regenerate: 'last_assistant',
    });
    await waitForRun(a.url, id, '10% done', (r) => doneOf(r) >= 0.1 * SAMPLES, 120_000, 50);
    const first = (await dispatcherPid(database.url)) === a.proc.pid ? a : b;
    const second = first === a ? b : a;

    // Stalled, not dead: its pid lives, so only its heartbeat going stale lets the other take over.
    first.proc.kill('SIGSTOP');
    const t0 = performance.now();
    await waitFor('the other replica to take the lock', async () => ((await dispatcherPid(database.url)) === second.proc.pid ? true : undefined), 60_000, 100);
    const takeoverMs = since(t0);
    const atTakeover = doneOf(await getRun(second.url, id));
    await waitForRun(second.url, id, 'progress under the new dispatcher', (r) => doneOf(r) > atTakeover + CAP, 60_000, 50);

    // Woken, it finds the lock gone at its next tick, stops dispatching and stands by.
    first.proc.kill('SIGCONT');
    await waitFor('the woken replica to stand by', () => (/another replica dispatches: standing by/.test(first.output()) ? true : undefined), 30_000, 50);
    expect(first.output()).toContain('the runner lock was taken by another process; dispatch stops');
    await waitFor('the woken replica to report standby', async () => ((await roleOf(first.url)) === 'standby' ? true : undefined), 10_000, 50);
    expect(await roleOf(second.url)).toBe('dispatching');
    expect(doneOf(await getRun(first.url, id)), 'the run is still under way').toBeLessThan(SAMPLES);

    // And it can dispatch again: the new dispatcher dies, the stood-by one takes over and finishes.
    await second.kill('SIGKILL');
    const done = await waitForEnd(first.url, id, 180_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(await dispatcherPid(database.url)).toBe(first.proc.pid);
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    await expectCountersMatchRecount(first.url, done);
    const out = await readOutput(done, prompts, `http://127.0.0.1:${s3.port}`);
    expect(out.lines.size).toBe(SAMPLES);
    expect((await sim.stats()).maxRunningSeen).toBeLessThanOrEqual(CAP);
    console.log(`replica stall: ${JSON.stringify({ takeover_ms: takeoverMs, max_running_seen: (await sim.stats()).maxRunningSeen })}`);
  }, 300_000);

  it('two runs for different models share the fleet by priority, through a takeover; a replica restarted on the database stands by and serves them', async () => {
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

    // Followed on a replica that stands by: what the low run completes while the high one is dispatched.
    const pid = await dispatcherPid(database.url);
    const first = replicas.find((r) => r.proc.pid === pid)!;
    expect(first, 'a replica dispatches').toBeDefined();
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
          // The dispatcher dies with samples of both runs claimed: its successor claims by priority again.
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
    // when the high one arrived or the new dispatcher started (a claim of the fleet's slots each
    // time), and the slots its last samples leave: a few dozen. Sharing the slots it would get
    // about as many as the high run's 900; served by age, all of them.
    const lowMeanwhile = lowAtHighAnswered! - lowAtHighStart!;
    expect(lowMeanwhile).toBeLessThanOrEqual(0.15 * 900);

    // The killed replica, restarted on the same database and folder, stands by and serves both runs.
    expect(killed, 'the dispatcher was killed mid-run').toBe(true);
    const restarted = await rig.serve(dirs[replicas.indexOf(first)], env);
    await waitFor('the restarted replica to stand by', async () => ((await roleOf(restarted.url)) === 'standby' ? true : undefined), 30_000, 100);
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
});
