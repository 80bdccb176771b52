import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from '../../src/sim/spawn.js';
import { Stores } from '../../src/storage/index.js';
import { HoldingProxy, S3RVER_AWS, startS3, type Hold, type S3Server } from '../support/faults.js';
import { spawnServer, tempDir, type ServerProcess } from '../support/server.js';
import { checkOutput, createRun, expectCountersMatchRecount, getRun, makePrompts, registerEndpoint, uploadFile, waitForStatus } from '../support/runner-checks.js';

// The soak variant of fault-crash-s3: a 20,000-sample run SIGKILLed over and over, each time at the
// next of three points (requests in flight, inside a shard PUT, between a PUT and its check),
// until it completes; then at both manifest points. `npm run soak` runs it.

const BUCKET = 'regen-soak-crash';
const SAMPLES = 20_000;
const SHARD_SIZE = 500;

/** Validated, and nothing left waiting to be sent (the run's total is 0 while it validates). */
const allSent = (run: any) => run.request_counts.total > 0 && run.request_counts.pending === 0;

describe.runIf(process.env.REGEN_SOAK)('soak: SIGKILL of an S3-writing server, over and over', () => {
  const s3dir = tempDir('regen-soak-s3rver-');
  const data = tempDir('regen-soak-crash-');
  const sims: SimProcess[] = [];
  let s3: S3Server;
  let proxy: HoldingProxy;
  let server: ServerProcess | null = null;
  const savedEnv = { ...process.env };

  beforeAll(async () => {
    s3 = await startS3(s3dir.dir, BUCKET);
    proxy = await new HoldingProxy({ host: '127.0.0.1', port: s3.port }).start();
    Object.assign(process.env, S3RVER_AWS);
    for (const seed of [1, 2, 3]) sims.push(await spawnSimulator({ 'ttft-ms': 150, 'tokens-per-second': 1000, 'max-running': 16, seed }));
  });

  afterAll(async () => {
    await server?.kill('SIGKILL');
    await Promise.all(sims.map((s) => s.stop()));
    await proxy?.close();
    await s3?.stop();
    process.env = savedEnv;
    s3dir.cleanup();
    data.cleanup();
  });

  const env = () => ({ ...S3RVER_AWS, REGEN_S3_ENDPOINT: proxy.url, REGEN_S3_FORCE_PATH_STYLE: 'true', REGEN_OUTPUT_URI: `s3://${BUCKET}/regen/` });
  const doneOf = (run: any) => run.request_counts.completed + run.request_counts.failed + run.request_counts.cancelled;

  it('completes with every prompt exactly once', async () => {
    server = await spawnServer(data.dir, env());
    for (const s of sims) await registerEndpoint(server.url, s.url);
    const prompts = makePrompts(SAMPLES, 'soak');
    const fileId = await uploadFile(server.url, prompts.jsonl);
    const { id } = await createRun(server.url, { model: 'sim-model', input: { file_id: fileId }, shard_size: SHARD_SIZE, regenerate: 'last_assistant' });
    const kills: string[] = [];
    const restart = async (point: string) => {
      const seen = await getRun(server!.url, id);
      await server!.kill('SIGKILL');
      kills.push(`${point}@${doneOf(seen)}`);
      server = await spawnServer(data.dir, env());
    };
    /** Waits for a held request, or for the run to settle first (then there is nothing left to hold). */
    const arrivedOrSettled = async (hold: Hold) => {
      let arrived = false;
      void hold.arrived.then(() => (arrived = true));
      for (;;) {
        if (arrived) return true;
        if (allSent(await getRun(server!.url, id))) return arrived;
        await new Promise((r) => setTimeout(r, 100));
      }
    };

    for (let cycle = 0; ; cycle++) {
      const run = await getRun(server.url, id);
      if (allSent(run)) break;
      await new Promise((r) => setTimeout(r, 1000 + Math.random() * 3000));
      const point = ['in flight', 'shard PUT', 'shard check'][cycle % 3];
      if (point === 'in flight') {
        if ((await getRun(server.url, id)).request_counts.in_progress === 0) continue;
        await restart(point);
        continue;
      }
      const hold = proxy.hold(point === 'shard PUT' ? 'PUT' : 'GET', /\/shard-\d{5}\.jsonl$/);
      const held = await arrivedOrSettled(hold);
      if (!held) {
        hold.release();
        break;
      }
      await restart(point);
    }
    for (const [method, point] of [['PUT', 'manifest PUT'], ['GET', 'manifest check']] as const) {
      const hold = proxy.hold(method, /\/manifest\.json$/);
      await hold.arrived;
      await restart(point);
    }

    const done = await waitForStatus(server.url, id, ['completed', 'failed', 'paused', 'cancelled'], 600_000);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES, failed: 0 });
    const stores = new Stores({ endpoint: s3.url, forcePathStyle: true });
    const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
    stores.close();
    expect(out.lines.size).toBe(SAMPLES);
    expect([...out.lines.values()].every((l) => l.attempts === 1)).toBe(true);
    await expectCountersMatchRecount(server.url, done);
    console.log(`soak crash-s3: ${kills.length} kills: ${kills.join(', ')}`);
    expect(kills.length).toBeGreaterThan(8);
  }, 1_200_000);
});
