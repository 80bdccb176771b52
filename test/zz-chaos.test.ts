import { afterAll, beforeAll, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from '../src/sim/spawn.js';
import { Stores } from '../src/storage/index.js';
import { call, spawnServer, tempDir, type ServerProcess } from './support/server.js';
import { checkOutput, createRun, expectCountersMatchRecount, makePrompts, registerEndpoint, uploadFile } from './support/runner-checks.js';

const data = tempDir('regen-chaos-');
const sims: SimProcess[] = [];
let server: ServerProcess | null = null;
beforeAll(async () => {
  sims.push(await spawnSimulator({ 'ttft-ms': 30, 'tokens-per-second': 1000, 'max-running': 16, 'error-rate': 0.05 }));
});
afterAll(async () => {
  await server?.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  data.cleanup();
});
it('chaos', async () => {
  server = await spawnServer(data.dir);
  await registerEndpoint(server.url, sims[0].url);
  const prompts = makePrompts(1500, 'x');
  const fileId = await uploadFile(server.url, prompts.jsonl);
  const { id } = await createRun(server.url, { model: 'sim-model', input: { file_id: fileId }, shard_size: 37, regenerate: 'last_assistant', max_attempts: 20 });
  let kills = 0;
  for (;;) {
    await new Promise((r) => setTimeout(r, 100 + Math.random() * 900));
    const run = (await call(server.url, `/v1/runs/${id}`)).body;
    if (run.status === 'completed') break;
    await server.kill(Math.random() < 0.3 ? 'SIGTERM' : 'SIGKILL');
    kills++;
    server = await spawnServer(data.dir, { REGEN_SHUTDOWN_GRACE_MS: '300' });
  }
  console.log('kills', kills);
  const done = (await call(server.url, `/v1/runs/${id}`)).body;
  const stores = new Stores({ forcePathStyle: false });
  const out = await checkOutput(stores.forUri(done.output_uri), prompts.expected);
  expect(out.lines.size).toBe(1500);
  await expectCountersMatchRecount(server.url, done);
}, 300_000);
