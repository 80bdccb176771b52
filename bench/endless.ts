import { join } from 'node:path';
import { type AnswerFault, startBrokenServer } from '../test/support/answer-faults.js';
import { spawnServer, tempDir } from '../test/support/server.js';
import { json, memoryOf, scaled, submitPrompts, until, type Figure } from './support.js';

// regen's peak memory when every request in flight meets a server that streams without end, half
// of them read buffered and half streamed, against the same number of proper answers.

// SGLang's usual context: each endless answer is cut at about 8 MiB (answerByteLimit), so 64 of
// them pass the default budget of the answers in flight (REGEN_ANSWER_BUFFER_BYTES, 256 MiB).
const CONTEXT = 65_536;
const RSS_TARGET_MIB = 1024;

/** A fresh regen against one server answering with `fault`; its peak RSS once both runs ended. */
async function peakWith(fault: AnswerFault, n: number): Promise<number> {
  const tmp = tempDir('regen-bench-endless-');
  const server = await startBrokenServer({ fault, contextLength: CONTEXT, holdUntil: n });
  // One attempt a sample: every endless answer fails the same way, a retry would only repeat it.
  const regen = await spawnServer(join(tmp.dir, 'data'), { REGEN_MAX_SERVER_FAULTS: '1', REGEN_ADAPTIVE_CONCURRENCY: 'false' });
  try {
    const post = (path: string, body: unknown) =>
      json(regen.url, path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    await post('/v1/endpoints', { url: server.url, max_concurrency: n });
    await until('the endpoint ready', async () => ((await json(regen.url, '/v1/endpoints')).data[0]?.state === 'ready' ? true : undefined), 30_000);
    const half = Math.ceil(n / 2);
    const runs = [
      await submitPrompts(regen.url, half, { model: 'broken-model', quality: false }),
      await submitPrompts(regen.url, n - half, { model: 'broken-model', quality: { stop_loops: true, gate: false } }),
    ];
    for (const id of runs) {
      await until('the run to end', async () => ((await json(regen.url, `/v1/runs/${id}`)).status === 'completed' ? true : undefined), 900_000, 200);
    }
    return memoryOf(regen.proc.pid!).peakMiB;
  } finally {
    await regen.kill('SIGKILL');
    await server.close();
    tmp.cleanup();
  }
}

export async function benchEndless(): Promise<Figure[]> {
  const n = scaled(64, 4);
  const normal = await peakWith('none', n);
  const endless = await peakWith('endless', n);
  return [
    {
      part: 'endless',
      figure: `peak RSS with ${n} answers that never end (half streamed) against ${n} proper answers`,
      regen: endless,
      baseline: normal,
      unit: 'MiB',
      ratio: normal / endless,
      target: `under ${RSS_TARGET_MIB} MiB`,
      ok: endless < RSS_TARGET_MIB,
    },
  ];
}
