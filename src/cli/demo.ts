import { mkdirSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { TEMP_FOLDER } from '../storage/location.js';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../config.js';
import { makeLogger } from '../logger.js';
import { startServer } from '../server.js';
import { spawnSimulator, type SimProcess } from '../sim/spawn.js';
import type { components } from '../client/index.js';
import { Client } from './client.js';
import { num, rate } from './format.js';

const MODEL = 'sim-model';

function prompts(n: number): string {
  const topics = ['binary search', 'TCP slow start', 'photosynthesis', 'the Krebs cycle', 'B-trees', 'Raft elections', 'Fourier series', 'garbage collection'];
  const lines: string[] = [];
  for (let i = 0; i < n; i++) {
    const topic = topics[i % topics.length];
    lines.push(
      JSON.stringify({
        custom_id: `demo-${String(i).padStart(5, '0')}`,
        messages: [
          { role: 'system', content: 'You are a careful teacher.' },
          { role: 'user', content: `Explain ${topic} to a new engineer (question ${i}).` },
          { role: 'assistant', content: 'OK.' },
        ],
      }),
    );
  }
  return lines.join('\n') + '\n';
}

/**
 * `regen demo`: the whole product in one command. A server on the embedded defaults, two SGLang
 * simulators (one still loading when the run starts), a few thousand prompts regenerated with
 * thinking on, followed live to the end, then the output folder listed.
 */
export async function demoCommand(flags: { data: string; samples: number; port: string; keep?: boolean }): Promise<void> {
  const n = flags.samples;
  const dataDir = resolve(flags.data);
  mkdirSync(dataDir, { recursive: true });
  const config = loadConfig(process.env, { data: dataDir, port: flags.port, 'log-level': process.env.REGEN_LOG_LEVEL ?? 'warn' });
  const server = await startServer(config, { logger: makeLogger(config.logLevel) });
  const sims: SimProcess[] = [];
  const shutdown = async () => {
    await server.close(5000);
    await Promise.all(sims.map((s) => s.stop()));
  };
  process.once('SIGINT', () => void shutdown().then(() => process.exit(130)));
  // The first of the server's tokens, when REGEN_API_TOKENS gives it any.
  const client = new Client({ server: server.url }, { REGEN_TOKEN: config.apiTokens[0] });
  try {
    console.log(`regen is listening on ${server.url} (dashboard: ${server.url}/, API reference: ${server.url}/docs)`);
    sims.push(await spawnSimulator({ model: MODEL, 'max-running': 32, 'ttft-ms': 40, 'tokens-per-second': 4000 }));
    sims.push(await spawnSimulator({ model: MODEL, 'max-running': 16, 'ttft-ms': 40, 'tokens-per-second': 4000, 'startup-ms': 3000 }));
    for (const [i, sim] of sims.entries()) {
      const ep = await client.post('/v1/endpoints', { body: { url: sim.url, name: `sim-${i + 1}` } });
      console.log(`registered simulator ${sim.url} as ${ep.id} (${ep.state})`);
    }
    const file = await client.upload('demo-prompts.jsonl', prompts(n));
    console.log(`uploaded ${n} prompts as ${file.id} (${file.bytes} bytes)`);
    const run = await client.post('/v1/runs', {
      body: {
        name: 'demo',
        model: MODEL,
        input: { file_id: file.id },
        regenerate: 'last_assistant',
        params: { temperature: 0.6, max_tokens: 2048, chat_template_kwargs: { enable_thinking: true } },
      },
    });
    console.log(`created run ${run.id}; following it (GET /v1/runs/${run.id})`);
    let view: components['schemas']['Run'];
    for (;;) {
      view = await client.get('/v1/runs/{id}', { params: { path: { id: run.id } } });
      const p = view.progress;
      const bar = '#'.repeat(Math.round(p.fraction * 30)).padEnd(30, '.');
      console.log(
        `[${bar}] ${(p.fraction * 100).toFixed(1).padStart(5)}%  ${view.status.padEnd(11)} ${num(view.request_counts.completed)}/${num(view.request_counts.total)} done, ` +
          `${num(view.request_counts.failed)} failed, ${num(view.quality.flagged)} flagged, shards ${num(view.shards.uploaded)}/${num(view.shards.total)}, ` +
          `${rate(p.samples_per_second)} samples/s, ETA ${p.eta_seconds ?? '?'} s`,
      );
      if (['completed', 'failed', 'cancelled', 'paused'].includes(view.status)) break;
      await new Promise((r) => setTimeout(r, 1000));
    }
    const eps = await client.get('/v1/endpoints');
    for (const e of eps.data) console.log(`endpoint ${e.name}: ${e.state}, cap ${num(e.max_concurrency)}, completed ${num(e.stats.completed)}`);
    if (view.status !== 'completed') throw new Error(`the demo run ended ${view.status}: ${view.status_reason ?? ''}`);
    const outDir = fileURLToPath(view.output_uri);
    console.log(`\nrun ${run.id} completed; output in ${outDir}`);
    // The store's temp folder (TEMP_FOLDER) stays in the prefix; it holds no output.
    for (const f of (await readdir(outDir)).filter((name) => name !== TEMP_FOLDER).sort()) console.log(`  ${f}`);
    if (flags.keep) {
      console.log(`\nstill serving ${server.url}; Ctrl-C to stop`);
      await new Promise(() => {});
    }
  } finally {
    await shutdown();
  }
}
