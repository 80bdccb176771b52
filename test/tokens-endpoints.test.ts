import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { answerIds, promptIds } from '../src/sim/token-ids.js';
import { Stores } from '../src/storage/index.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, REGEN, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { createRun, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// Token rows (`output.tokens`) and the endpoints that serve them, on simulator processes: a 400
// naming an id parameter is regen's mistake (the endpoint is probed again, the sample asked again
// with nothing charged), and one that refuses them three times since its start serves no such run,
// its samples given back unspent to another; the endpoints left out for want of ids are named on the run while others
// serve it (in `regen status` and on the run page); a sample's trainable tokens are the loss mask's 1s written, none for an answer whose
// ids never came back (a stream cut for looping); a vLLM endpoint streams its ids, keeping the loop watch.

const TERMINAL = ['completed', 'failed', 'paused', 'cancelled'];
const CHROMIUM = '/usr/bin/chromium';
const haveChromium = existsSync(CHROMIUM);
if (!haveChromium && process.env.CI === 'true') throw new Error(`${CHROMIUM} is missing: the token endpoints test reads the run page in it on CI`);
if (!haveChromium) console.warn(`\n*** ${CHROMIUM} is missing: the run page's "Without token ids" is not looked at ***\n`);
const data = tempDir('regen-tokens-ep-');
const sims: SimProcess[] = [];
let server: ServerProcess | null = null;

async function sim(flags: Record<string, string | number>): Promise<SimProcess> {
  const s = await spawnSimulator({ 'ttft-ms': 10, 'tokens-per-second': 3000, 'completion-tokens': 24, 'reasoning-tokens': 16, ...flags });
  sims.push(s);
  return s;
}

/**
 * A run of 12 questions, the fourth looping (`[loop]`), with token rows, on a simulator of its own
 * (60 + 40 tokens an answer at 400 a second), answers kept as cut; resolves once it has ended.
 */
async function loopingRun(tag: string, flags: Record<string, string | number> & { model: string }) {
  const s = await sim({ 'completion-tokens': 60, 'reasoning-tokens': 40, 'tokens-per-second': 400, seed: 5, ...flags });
  await registerEndpoint(server!.url, s.url, { name: `${tag}-endpoint` });
  const content = (i: number) => `Question ${i}${i === 3 ? ' [loop]' : ''}`;
  const lines = Array.from({ length: 12 }, (_, i) => JSON.stringify({ custom_id: `${tag}-${i}`, messages: [{ role: 'user', content: content(i) }] }));
  const fileId = await uploadFile(server!.url, lines.join('\n') + '\n');
  const { id } = await createRun(server!.url, {
    model: flags.model,
    input: { file_id: fileId },
    params: { max_tokens: 20_000, chat_template_kwargs: { enable_thinking: true } },
    quality: { retry_flagged: 0, gate: false },
    output: { tokens: true },
  });
  const done = await waitForStatus(server!.url, id, TERMINAL);
  expect(done.status, done.status_reason).toBe('completed');
  return { id, done, content };
}

beforeAll(async () => {
  server = await spawnServer(data.dir);
});

afterAll(async () => {
  await server?.kill('SIGKILL');
  await Promise.all(sims.map((s) => s.stop()));
  data.cleanup();
});

async function tokensRun(model: string, n: number, tag: string, extra: Record<string, unknown> = {}): Promise<string> {
  const lines = Array.from({ length: n }, (_, i) =>
    JSON.stringify({ custom_id: `${tag}-${i}`, messages: [{ role: 'user', content: `Question ${i} of ${tag}` }] }),
  );
  const fileId = await uploadFile(server!.url, lines.join('\n') + '\n');
  const { id } = await createRun(server!.url, { model, input: { file_id: fileId }, params: { max_tokens: 256 }, output: { tokens: true }, ...extra });
  return id;
}

/** Every text line and training row of a finished run. */
async function readOutput(outputUri: string): Promise<{ lines: any[]; rows: any[] }> {
  const stores = new Stores({ forcePathStyle: false });
  try {
    const store = stores.forUri(outputUri);
    const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
    const out = { lines: [] as any[], rows: [] as any[] };
    for (const f of manifest.files.filter((x: any) => x.kind === 'jsonl' || x.kind === 'tokens')) {
      const parsed = (await store.get(f.key))
        .toString('utf8')
        .trimEnd()
        .split('\n')
        .map((t) => JSON.parse(t));
      (f.kind === 'tokens' ? out.rows : out.lines).push(...parsed);
    }
    return out;
  } finally {
    stores.close();
  }
}

describe('output.tokens and its endpoints', () => {
  it('a 400 naming an id parameter: the endpoint is probed again and the sample asked again, nothing charged', async () => {
    // Two answers at a time, 100 ms each: the run is still going when the server changes under it.
    const s = await sim({ model: 'refuse-model', 'max-running': 2, 'ttft-ms': 100 });
    await registerEndpoint(server!.url, s.url, { name: 'refusing', max_concurrency: 2 });
    const id = await tokensRun('refuse-model', 40, 'r');
    await waitFor('a few answers', async () => ((await call(server!.url, `/v1/runs/${id}`)).body.request_counts.completed >= 4 ? true : undefined));
    // As a server restarted as a version without the parameter, once: the next request asking ids gets a 400 naming it.
    const res = await fetch(`${s.url}/sim/config`, { method: 'POST', body: JSON.stringify({ refuseIdRequests: 1 }) });
    expect(res.status).toBe(200);
    const done = await waitForStatus(server!.url, id, TERMINAL);
    expect(done.status, done.status_reason).toBe('completed');
    const { lines, rows } = await readOutput(done.output_uri);
    // Each sample written exactly once, text and row.
    expect(new Set(lines.map((l) => l.custom_id)).size).toBe(40);
    expect(lines).toHaveLength(40);
    expect(rows.map((r) => r.custom_id).sort()).toEqual(lines.map((l) => l.custom_id).sort());
    // No sample was charged for the refusal: one attempt each, none failed.
    expect(lines.every((l) => l.attempts === 1)).toBe(true);
    const stats = await s.stats();
    // The refusal was used up: an empty patch answers the knobs as they are.
    expect((await fetch(`${s.url}/sim/config`, { method: 'POST', body: '{}' }).then((r) => r.json())).refuseIdRequests).toBe(0);
    // The 40 answers and two probes: the first, and the one after the refusal.
    expect(stats.completed).toBe(40 + 2);
  });

  it('a server that refuses the id parameters three times since its start serves no such run: its samples go back unspent', async () => {
    // Its probes, unstreamed, find the sglext ids; its streamed requests are refused for them.
    // One request at a time, so the refusals and re-probes alternate: probe, refusal, three times.
    const s = await sim({ model: 'half-model', 'refuse-streamed-ids': 1 });
    await registerEndpoint(server!.url, s.url, { name: 'half-ids', max_concurrency: 1 });
    const id = await tokensRun('half-model', 20, 'h');
    const url = server!.url;
    const waiting = await waitFor('the run to wait for an endpoint with ids', async () => {
      const run = (await call(url, `/v1/runs/${id}`)).body;
      return run.status_reason && run.progress.without_ids?.length ? run : undefined;
    });
    expect(waiting.status_reason).toMatch(/waiting for an endpoint that returns token ids.*half-ids return none/);
    expect(waiting.progress.without_ids).toEqual([
      { endpoint_id: expect.stringMatching(/^ep_/), name: 'half-ids', reason: 'refused the token-id parameters its probe found 3 times since it started' },
    ]);
    // Nothing charged: no sample failed or finished, none is in flight.
    expect(waiting.request_counts).toMatchObject({ completed: 0, failed: 0 });
    // Three probes answered (the first and one after each of the first two refusals), nothing else.
    expect((await s.stats()).completed).toBe(3);
    // Another server that returns ids takes the samples given back.
    await registerEndpoint(url, (await sim({ model: 'half-model' })).url, { name: 'whole-ids' });
    const done = await waitForStatus(url, id, TERMINAL);
    expect(done.status, done.status_reason).toBe('completed');
    const { lines, rows } = await readOutput(done.output_uri);
    expect(new Set(lines.map((l) => l.custom_id)).size).toBe(20);
    expect(lines.every((l) => l.attempts === 1)).toBe(true);
    expect(rows.map((r) => r.custom_id).sort()).toEqual(lines.map((l) => l.custom_id).sort());
    // Until it restarts, the refusing server is sent no more of it.
    expect((await s.stats()).completed).toBe(3);
  });

  it('the endpoints left out for want of ids are named on the run and in regen status while another serves it', async () => {
    const old = await sim({ model: 'mixed-model', 'token-id-api': 'none' });
    await registerEndpoint(server!.url, old.url, { name: 'no-ids-server' });
    // Paced so the run is still dispatched when it is read: 60 answers two at a time, 100 ms each.
    const newer = await sim({ model: 'mixed-model', 'max-running': 2, 'ttft-ms': 100 });
    const ep = await registerEndpoint(server!.url, newer.url, { name: 'ids-server', max_concurrency: 2 });
    const id = await tokensRun('mixed-model', 60, 'm');
    const url = server!.url;
    const running = await waitFor('the run to name the endpoint left out', async () => {
      const run = (await call(url, `/v1/runs/${id}`)).body;
      return run.status === 'in_progress' && run.progress.without_ids.length ? run : undefined;
    });
    expect(running.progress.without_ids).toEqual([
      { endpoint_id: expect.stringMatching(/^ep_/), name: 'no-ids-server', reason: expect.stringMatching(/returns no token ids/) },
    ]);
    expect(running.progress.without_ids[0].endpoint_id).not.toBe(ep.id);
    // Not waiting: another endpoint serves it.
    expect(running.status_reason).toBeNull();
    const status = spawnSync(process.execPath, [...REGEN, 'status', id], { env: { ...process.env, REGEN_URL: url }, encoding: 'utf8' });
    expect(status.stdout).toMatch(/without ids\s+not sent to no-ids-server \(ep_\w+\): returns no token ids/);
    if (haveChromium) {
      // The page says it too, with the reason under it. Answers held at 2 s meanwhile, so the run is
      // still dispatched however long the browser takes to start.
      await newer.configure({ ttftMs: 2000 });
      const browser = await chromium.launch({
        executablePath: CHROMIUM,
        args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
      });
      try {
        const page = await browser.newPage();
        await page.goto(`${url}/#/runs/${id}`);
        const stat = page.locator('.stat', { has: page.locator('.label', { hasText: 'Without token ids' }) });
        await expect.poll(() => stat.locator('.value').textContent(), { timeout: 30_000 }).toBe('no-ids-server');
        expect(await stat.locator('.small').textContent()).toMatch(/^no-ids-server: returns no token ids/);
      } finally {
        await browser.close();
        await newer.configure({ ttftMs: 100 });
      }
    }
    const done = await waitForStatus(url, id, TERMINAL);
    expect(done.status).toBe('completed');
    // A finished run is sent nowhere: the list is empty.
    expect(done.progress.without_ids).toEqual([]);
    // The endpoint without ids answered only its probes: sglext, return_token_ids streamed, then unstreamed.
    expect((await old.stats()).completed).toBe(3);
  });

  it("a vLLM endpoint streams its ids: the loop watch is kept, and the rows are the server's ids", async () => {
    // As the loop test below: at 400 tokens/s a looping answer streamed is cut after a few hundred
    // tokens; asked unstreamed it would run its 20,000 max_tokens.
    const { id, done, content } = await loopingRun('v', { model: 'vllm-model', 'token-id-api': 'vllm' });
    const looped = (await call(server!.url, `/v1/runs/${id}/samples/v-3`)).body;
    expect(looped.usage.completion_tokens).toBeGreaterThan(0);
    expect(looped.usage.completion_tokens).toBeLessThan(2000);
    const { lines: written, rows } = await readOutput(done.output_uri);
    // Every other sample one row: the prompt's ids as the simulator tokenized it, then the answer's, read off the stream.
    expect(rows.map((r) => r.custom_id).sort()).toEqual(
      written
        .map((l) => l.custom_id)
        .filter((c) => c !== 'v-3')
        .sort(),
    );
    for (const row of rows) {
      const prompt = promptIds([{ role: 'user', content: content(Number(row.custom_id.split('-')[1])) }]);
      const line = written.find((l) => l.custom_id === row.custom_id);
      const answer = answerIds(`${line.reasoning_content ?? ''}${line.content ?? ''}`, line.usage.completion_tokens, line.finish_reason === 'stop');
      // The streamed pieces put back in order: exactly the ids the simulator made for this answer.
      expect(row.input_ids).toEqual([...prompt, ...answer]);
      expect(row.loss_mask).toEqual([...prompt.map(() => 0), ...answer.map(() => 1)]);
      expect(row.num_trainable).toBe(line.usage.completion_tokens);
    }
  });

  it("a sample's trainable tokens are its rows' loss-mask 1s: none for an answer cut for looping, whose ids never came back", async () => {
    // At 400 tokens/s a looping answer is cut after a few hundred tokens, long before its max_tokens.
    // Kept as cut (no retry of the flagged), so it is a completed sample with no row.
    const { id, done } = await loopingRun('l', { model: 'loop-model' });
    const { rows } = await readOutput(done.output_uri);
    const looped = (await call(server!.url, `/v1/runs/${id}/samples/l-3`)).body;
    expect(looped.status).toBe('completed');
    expect(looped.usage.completion_tokens).toBeGreaterThan(0);
    expect(rows.some((r) => r.custom_id === 'l-3')).toBe(false);
    expect(looped.trainable_tokens).toBe(0);
    // Another sample: its row's ones, read from the written tokens file.
    const row = rows.find((r) => r.custom_id === 'l-5');
    expect(row.loss_mask.filter((m: number) => m === 1)).toHaveLength(row.num_trainable);
    expect((await call(server!.url, `/v1/runs/${id}/samples/l-5`)).body.trainable_tokens).toBe(row.num_trainable);
  });
});
