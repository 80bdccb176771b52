import { spawnSimulator } from '../src/sim/spawn.js';
import { startTestServer } from '../test/support/server.js';
import { json, promptLine, sleep } from './support.js';
import { Session } from 'node:inspector/promises';
import { writeFileSync } from 'node:fs';
const sims = [await spawnSimulator({ model: 'm', 'max-running': 64, 'max-queue': 100000 }), await spawnSimulator({ model: 'm', 'max-running': 64, 'max-queue': 100000 })];
const server = await startTestServer({});
const body = Array.from({ length: 10000 }, (_, i) => promptLine(i)).join('\n');
const f = await json(server.url, '/v1/files', { method: 'POST', headers: { 'content-type': 'application/jsonl' }, body });
for (const sim of sims) await json(server.url, '/v1/endpoints', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ url: sim.url }) });
await sleep(1500);
const session = new Session(); session.connect(); await session.post('Profiler.enable'); await session.post('Profiler.start');
const t0 = Date.now();
const run = await json(server.url, '/v1/runs', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm', input: { file_id: f.id }, quality: false }) });
for (;;) { const r = await json(server.url, `/v1/runs/${run.id}`); if (r.status === 'completed') { console.log('done', r.request_counts.completed, (Date.now() - t0) / 1000, 's'); break; } await sleep(200); }
const { profile } = await session.post('Profiler.stop'); writeFileSync('/tmp/prof3.cpuprofile', JSON.stringify(profile));
await server.cleanup(); for (const s of sims) await s.stop();
