import { afterAll, expect, it } from 'vitest';
import { doneOf, faultRig, readOutput, waitForEnd, waitForRun } from './support/fault-rig.js';
import { describePg } from './support/pg.js';
import { coordinatorPid, replicaDatabases, replicaDirs, replicaEnv } from './support/replicas.js';
import { createRun, expectCountersMatchRecount, getRun, makePrompts, registerEndpoint, uploadFile } from './support/runner-checks.js';
import { waitFor } from './support/server.js';

// A rolling deploy that adds REGEN_SECRET_KEY: the replica restarted with the key seals the
// endpoints' api_keys on its start, while one still running without it holds the runner lock and
// drives the endpoint. That one must leave (the README's one line, exit code 2), not fail every
// tick, and the replica with the key carries the run to its end.

const SAMPLES = 400;
const CAP = 4;
const KEY = Buffer.alloc(32, 5).toString('base64');
const NO_KEY_LINE = 'regen: a stored secret is sealed, and REGEN_SECRET_KEY is not set';
/** The lines `regen` itself wrote to stderr, apart from its JSON log. */
const regenLines = (output: string) => output.split('\n').filter((l) => l.startsWith('regen: '));

const rig = faultRig();
const databases = replicaDatabases();
afterAll(async () => {
  await rig.stop();
  await databases.drop();
});

await describePg('rolling REGEN_SECRET_KEY into two replicas', () => {
  it('the replica without the key exits with the one line once the other seals, and the run completes with every sample once', async () => {
    const database = await databases.create('key-roll');
    const env = await replicaEnv(rig, database);
    // Slow enough that the run is under way when the second replica has loaded and sealed.
    const sim = await rig.sim({ 'max-running': 64, 'ttft-ms': 400, 'tokens-per-second': 2000, seed: 11 });
    const [dirA, dirB] = replicaDirs(rig, 'regen-key-roll', ['a', 'b']);
    const a = await rig.serve(dirA, env);
    await registerEndpoint(a.url, sim.url, { max_concurrency: CAP, api_key: 'sk-endpoint-key-roll' });
    const prompts = makePrompts(SAMPLES, 'roll');
    const fileId = await uploadFile(a.url, prompts.jsonl);
    const { id } = await createRun(a.url, { model: 'sim-model', input: { file_id: fileId }, shard_size: 100, regenerate: 'last_assistant' });
    await waitForRun(a.url, id, 'answers from the replica without the key', (r) => doneOf(r) > 0, 60_000, 50);
    expect(await coordinatorPid(database.url)).toBe(a.proc.pid);

    const b = await rig.serve(dirB, { ...env, REGEN_SECRET_KEY: KEY });
    const code = await waitFor('the replica without the key to exit', () => a.proc.exitCode ?? undefined, 60_000);
    expect(code).toBe(2);
    // Its pipes may still hold the line when the exit is seen.
    await waitFor('the one line', () => (regenLines(a.output()).length ? true : undefined), 10_000);
    expect(regenLines(a.output())).toEqual([NO_KEY_LINE]);
    // It left at the first failure rather than retrying the step that read a secret every tick
    // (10 a second): a step or two already under way may fail once more as it closes.
    expect(
      a
        .output()
        .split('\n')
        .filter((l) => l.includes('REGEN_SECRET_KEY is not set')).length,
    ).toBeLessThanOrEqual(6);

    // The run was under way: what is left is the other replica's to do.
    expect(doneOf(await getRun(b.url, id))).toBeLessThan(SAMPLES);
    await waitFor('the replica with the key to coordinate', async () => ((await coordinatorPid(database.url)) === b.proc.pid ? true : undefined), 60_000);
    await sim.configure({ ttftMs: 5, tokensPerSecond: 20_000 });
    const done = await waitForEnd(b.url, id, 180_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    await expectCountersMatchRecount(b.url, done);
    const out = await readOutput(done, prompts, `http://127.0.0.1:${rig.s3!.port}`);
    expect(out.lines.size).toBe(SAMPLES);
  }, 300_000);
});
