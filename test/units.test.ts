import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, REGEN, startTestServer, waitFor } from './support/server.js';
import { createRun, registerEndpoint, waitForStatus } from './support/runner-checks.js';
import { Stores } from '../src/storage/index.js';

// One unit per figure, named where it is shown: a conversation run counts conversations and rates
// them in conversations and turns; an n = 3 run shows its requests and the samples they answer. The
// API, /metrics, `regen status` and the page say the same numbers under the same names, read once
// each run has completed (so none of them moves between two reads).

const CHROMIUM = '/usr/bin/chromium';
const SHOTS = fileURLToPath(new URL('../test-artifacts/', import.meta.url));
const haveChromium = existsSync(CHROMIUM);
if (!haveChromium && process.env.CI === 'true') throw new Error(`${CHROMIUM} is missing: the units test needs Debian's chromium on CI`);
if (!haveChromium) console.warn(`SKIPPED: ${CHROMIUM} is missing, so the units test does not run`);

const CONVERSATIONS = 12;
const TURNS = 3;
const N = 3;
const LINES = 40;
const SIM = { 'ttft-ms': 5, 'tokens-per-second': 3000, 'completion-tokens': 16, 'reasoning-tokens': 0, 'enable-cache-report': 1 };
const NAMES = ['units-left', 'units-right'];

let server: Awaited<ReturnType<typeof startTestServer>>;
let sims: SimProcess[] = [];
let slow: SimProcess;
let browser: Browser;

function conversation(i: number) {
  const messages: { role: string; content: string }[] = [{ role: 'system', content: 'You are terse.' }];
  for (let t = 0; t < TURNS; t++) messages.push({ role: 'user', content: `Question ${t} of conversation ${i}` }, { role: 'assistant', content: 'old' });
  return { custom_id: `conv-${i}`, messages };
}

/** `regen status [RUN]`'s standard output. */
async function regenStatus(...args: string[]): Promise<string> {
  const child = spawn(process.execPath, [...REGEN, 'status', ...args], {
    env: { ...process.env, REGEN_URL: server.url, NO_COLOR: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  expect((await once(child, 'exit'))[0]).toBe(0);
  return out;
}

/** A row of `regen status RUN`: its value, after the padded key. */
function detailRow(detail: string, key: string): string {
  const line = detail.split('\n').find((l) => new RegExp(`^${key}\\s{2,}`).test(l));
  expect(line, `a ${key} row in\n${detail}`).toBeDefined();
  return line!.replace(new RegExp(`^${key}\\s+`), '');
}

/** A series' value in the Prometheus text, by its name and labels as written. */
function series(metrics: string, name: string, labels: string): number | undefined {
  const line = metrics.split('\n').find((l) => l.startsWith(`${name}{${labels}} `));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}

/** The page's rate format (src/dashboard/format.js rate). */
const pageRate = (perSecond: number) => (!perSecond ? '0' : perSecond >= 100 ? Math.round(perSecond).toLocaleString('en-US') : perSecond.toFixed(1));
/** The CLI's (src/cli/format.ts rate). */
const cliRate = (perSecond: number) => (perSecond >= 100 ? Math.round(perSecond).toLocaleString('en-US') : (perSecond || 0).toFixed(1));

async function openRunPage(width: number, runId: string): Promise<{ page: Page; problems: string[]; close(): Promise<void> }> {
  const context = await browser.newContext({ viewport: { width, height: 900 } });
  const page = await context.newPage();
  const problems: string[] = [];
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    if (msg.type() === 'error') problems.push(`console: ${msg.text()}`);
  });
  await page.goto(`${server.url}/#/runs/${runId}`);
  // The endpoints and shards panels are read after the run: wait for both.
  await page.locator('table.endpoints').waitFor({ timeout: 15_000 });
  await page.locator('.shard-grid').waitFor({ timeout: 15_000 });
  return { page, problems, close: () => context.close() };
}

const statValue = (page: Page, label: string) => page.locator('.stat', { has: page.locator('.label', { hasText: label }) }).locator('.value');
const statExtra = (page: Page, label: string) => page.locator('.stat', { has: page.locator('.label', { hasText: label }) }).locator('.small');

describe.skipIf(!haveChromium)('units across the API, /metrics, the CLI and the page', () => {
  beforeAll(async () => {
    [server, slow, ...sims] = await Promise.all([
      startTestServer(),
      // 2 tokens a request at 4 tokens/s: each answer of the n = 3 run is out for about half a second.
      spawnSimulator({ ...SIM, 'tokens-per-second': 4, 'completion-tokens': 2, model: 'slow-model' }),
      ...NAMES.map((_, i) => spawnSimulator({ ...SIM, seed: i + 1 })),
    ]);
    for (const [i, sim] of sims.entries()) await registerEndpoint(server.url, sim.url, { name: NAMES[i] });
    await registerEndpoint(server.url, slow.url, { name: 'units-slow', max_concurrency: 4 });
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'] });
    mkdirSync(SHOTS, { recursive: true });
  });

  afterAll(async () => {
    await browser?.close();
    await server?.cleanup();
    await Promise.all([slow, ...sims].map((s) => s?.stop()));
  });

  it('a conversation run: conversations and turns, each named, the same on every surface', async () => {
    const created = await createRun(server.url, {
      name: 'units conversations',
      model: 'sim-model',
      regenerate: 'all_assistant',
      input: { requests: Array.from({ length: CONVERSATIONS }, (_, i) => conversation(i)) },
      output: { format: 'parquet' },
      split: { eval: 0.5 },
      variants: [
        { name: 'warm', weight: 1, params: { temperature: 0.9 } },
        { name: 'cool', weight: 1, params: { temperature: 0.1 } },
      ],
      quality: { gate: false },
    });
    const run = await waitForStatus(server.url, created.id, ['completed']);

    // The API: conversations in request_counts, their requests in turns, a rate for each.
    expect(run.request_counts).toMatchObject({ total: CONVERSATIONS, completed: CONVERSATIONS });
    expect(run.turns).toMatchObject({ total: CONVERSATIONS * TURNS, completed: CONVERSATIONS * TURNS, in_flight: 0, failed: 0 });
    const elapsed = (Date.parse(run.finished_at) - Date.parse(run.started_at)) / 1000;
    expect(run.progress.samples_per_second).toBeCloseTo(CONVERSATIONS / elapsed, 1);
    expect(run.progress.turns_per_second).toBeCloseTo((CONVERSATIONS * TURNS) / elapsed, 1);
    expect(run.progress.turns_per_second).toBeGreaterThan(run.progress.samples_per_second);
    expect(run.progress.requests_per_second).toBeNull();
    expect(run.card_uri).toBe(`${run.output_uri.replace(/\/?$/, '/')}README.md`);
    const byName = new Map(run.cache_by_endpoint.map((e: any) => [e.endpoint_name, e]));
    expect([...byName.keys()].sort()).toEqual(NAMES.filter((n) => byName.has(n)).sort());
    expect(byName.size, JSON.stringify(run.cache_by_endpoint)).toBeGreaterThan(0);

    // /metrics: the same counts under the API's names.
    const metrics = (await call<string>(server.url, '/metrics')).body;
    const labels = (status: string) => `run_id="${run.id}",status="${status}"`;
    expect(series(metrics, 'regen_run_samples', labels('completed'))).toBe(run.request_counts.completed);
    for (const status of ['total', 'completed', 'failed', 'in_flight'] as const)
      expect(series(metrics, 'regen_run_turns', labels(status)), status).toBe(run.turns[status]);
    expect(series(metrics, 'regen_run_in_flight', `run_id="${run.id}"`)).toBe(run.progress.in_flight);
    expect(metrics).not.toContain(`regen_run_requests{run_id="${run.id}"`);

    // The CLI: the detail and the list, each rate with its unit.
    const detail = await regenStatus(run.id);
    expect(detail).toMatch(new RegExp(`conversations\\s+${CONVERSATIONS} completed, 0 failed, 0 claimed ahead, 0 pending`));
    expect(detail).toMatch(/in flight\s+0 turns\n/);
    expect(detail).toMatch(new RegExp(`turns\\s+${CONVERSATIONS * TURNS} of ${CONVERSATIONS * TURNS} answered, 0 in flight, 0 failed`));
    expect(detailRow(detail, 'rate')).toBe(
      `${cliRate(run.progress.samples_per_second)} conversations/s, ${cliRate(run.progress.turns_per_second)} turns/s, ${cliRate(run.progress.completion_tokens_per_second)} completion tokens/s`,
    );
    expect(detail).toMatch(/setup\s+regenerate all_assistant, n 1, split 50% eval, the rest train, format parquet, card README\.md beside the shards/);
    expect(detailRow(detail, 'card')).toBe(run.card_uri);
    const cacheLine = detailRow(detail, 'cache');
    for (const e of run.cache_by_endpoint) expect(cacheLine).toContain(`${e.endpoint_name} `);
    expect(cacheLine).not.toContain('ep_');
    const list = await regenStatus();
    expect(list.split('\n').find((l) => l.startsWith(run.id))).toContain(`${cliRate(run.progress.samples_per_second)} conversations/s`);

    // The page: the same figures, each under its unit.
    const { page, problems, close } = await openRunPage(1440, run.id);
    expect(await statValue(page, 'Average rate').textContent()).toBe(`${pageRate(run.progress.samples_per_second)} conversations/s`);
    expect(await statExtra(page, 'Average rate').textContent()).toBe(
      `${pageRate(run.progress.turns_per_second)} turns/s · ${pageRate(run.progress.completion_tokens_per_second)} tokens/s`,
    );
    expect(await statValue(page, 'Completed conversations').textContent()).toBe(String(CONVERSATIONS));
    expect(await statValue(page, 'In flight (turns)').textContent()).toBe('0');
    expect(await statValue(page, 'Turns answered').textContent()).toBe(`${CONVERSATIONS * TURNS} / ${CONVERSATIONS * TURNS}`);
    const cache = await statExtra(page, 'Prefix cache').textContent();
    for (const e of run.cache_by_endpoint) expect(cache).toContain(e.endpoint_name);
    expect(cache).not.toContain('ep_');
    expect(await page.locator('.setting-regenerate').textContent()).toBe('all_assistant');
    expect(await page.locator('.setting-n').textContent()).toBe('1');
    expect(await page.locator('.setting-split').textContent()).toBe('50% eval, the rest train');
    expect(await page.locator('.setting-format').textContent()).toBe('parquet');
    expect(await page.locator('.setting-card').textContent()).toBe('README.md beside the shards');
    // The endpoints count requests over every run, and say so.
    const heads = await page.locator('table.endpoints th').allTextContents();
    expect(heads).toContain('Requests/s');
    expect(heads).toContain('Answers done / failed (all runs)');
    expect(heads).not.toContain('Samples/s');
    // The shards by split, adding up to the run's conversations.
    const splits = await page.locator('.shard-split').allTextContents();
    expect(splits.map((s) => s.replace(/^ · /, '').split(' ')[0])).toEqual(['train', 'eval']);
    const done = splits.map((s) => Number(/(\d+) of \d+ conversations done/.exec(s)![1]));
    expect(done.reduce((a, b) => a + b, 0)).toBe(CONVERSATIONS);
    // The CLI's shards row breaks them down the same way.
    const shardsRow = detailRow(detail, 'shards');
    for (const s of splits) expect(shardsRow).toContain(s.replace(/^ · /, ''));
    // The forecast rests on answered turns, its calibration slice on conversations: each named.
    expect(await page.locator('.forecast').textContent()).toMatch(/Based on[\d,]+ turns answered \(calibration slice of [\d,]+ conversations\)/);
    await page.screenshot({ path: `${SHOTS}units-conversations-1440.png`, fullPage: true });

    // The samples list: each conversation's variant and its answered turns.
    await page.goto(`${server.url}/#/runs/${run.id}/samples`);
    await page.locator('table th', { hasText: 'Turns' }).waitFor({ timeout: 15_000 });
    const samples = (await call(server.url, `/v1/runs/${run.id}/samples`)).body.data;
    expect(samples.every((s: any) => s.turns_answered === TURNS && ['warm', 'cool'].includes(s.variant))).toBe(true);
    const firstRow = await page.locator('table tbody tr').first().locator('td').allTextContents();
    const headers = await page.locator('table th').allTextContents();
    expect(firstRow[headers.indexOf('Variant')]).toBe(samples[0].variant);
    expect(firstRow[headers.indexOf('Turns')]).toBe(String(TURNS));
    expect(problems).toEqual([]);
    await close();

    // The dataset card says how the run ended and how its conversations were made.
    const store = new Stores({ forcePathStyle: false }).forUri(run.output_uri);
    const card = (await store.get('README.md')).toString('utf8');
    expect(card).toContain(`(run \`${run.id}\`, created ${run.created_at}, completed)`);
    expect(card).toContain('regenerated turn by turn');
    expect(card).not.toContain('Each input prompt was sent');
  });

  it('an n = 3 run: requests and the samples they answer, both shown and labelled', async () => {
    const created = await createRun(server.url, {
      model: 'slow-model',
      input: { requests: Array.from({ length: LINES }, (_, i) => ({ custom_id: `line-${i}`, messages: [{ role: 'user', content: `Line ${i}` }] })) },
      params: { n: N, max_tokens: 16 },
      quality: { gate: false },
    });
    // While it runs, one read: each request in flight answers a line's three samples, within the cap.
    const busy = await waitFor('requests in flight', async () => {
      const r = (await call(server.url, `/v1/runs/${created.id}`)).body;
      return r.progress.in_flight > 0 ? r : undefined;
    });
    expect(busy.progress.in_flight).toBeLessThanOrEqual(4);
    expect(busy.progress.samples_in_flight).toBe(N * busy.progress.in_flight);
    const run = await waitForStatus(server.url, created.id, ['completed']);
    expect(run.request_counts).toMatchObject({ total: LINES * N, completed: LINES * N });
    expect(run.turns).toBeNull();
    expect(run.progress.turns_per_second).toBeNull();

    const metrics = (await call<string>(server.url, '/metrics')).body;
    expect(series(metrics, 'regen_run_samples', `run_id="${run.id}",status="completed"`)).toBe(LINES * N);
    expect(series(metrics, 'regen_run_in_flight', `run_id="${run.id}"`)).toBe(0);
    expect(series(metrics, 'regen_run_samples_in_flight', `run_id="${run.id}"`)).toBe(0);
    expect(metrics).not.toContain(`regen_run_turns{run_id="${run.id}"`);
    // Its requests, each a line's three samples: the counts behind the requests/s below, over the run's time.
    const requests = (status: string) => series(metrics, 'regen_run_requests', `run_id="${run.id}",status="${status}"`);
    expect({ total: requests('total'), completed: requests('completed'), failed: requests('failed'), in_flight: requests('in_flight') }).toEqual({
      total: LINES,
      completed: LINES,
      failed: 0,
      in_flight: 0,
    });
    const elapsed = (Date.parse(run.finished_at) - Date.parse(run.started_at)) / 1000;
    expect(run.progress.requests_per_second).toBeCloseTo(requests('completed')! / elapsed, 1);

    const detail = await regenStatus(run.id);
    expect(detail).toMatch(new RegExp(`samples\\s+${LINES * N} completed, 0 failed, 0 claimed ahead, 0 pending`));
    expect(detail).toMatch(/in flight\s+0 requests \(0 samples, n = 3\)/);
    // The requests rate beside the samples rate: each request answers a line's three samples.
    expect(run.progress.requests_per_second).toBeCloseTo(run.progress.samples_per_second / N, 1);
    expect(detailRow(detail, 'rate')).toMatch(
      new RegExp(
        `^${cliRate(run.progress.samples_per_second).replace('.', '\\.')} samples/s, ${cliRate(run.progress.requests_per_second).replace('.', '\\.')} requests/s, `,
      ),
    );
    expect(detail).toMatch(/setup\s+regenerate none \(prompts answered as given\), n 3, split none, format jsonl, card none/);

    const { page, problems, close } = await openRunPage(1024, run.id);
    expect(await statValue(page, 'Average rate').textContent()).toBe(`${pageRate(run.progress.samples_per_second)} samples/s`);
    expect(await statExtra(page, 'Average rate').textContent()).toContain(`${pageRate(run.progress.requests_per_second)} requests/s`);
    expect(await statValue(page, 'In flight (requests)').textContent()).toBe('0');
    expect(await statExtra(page, 'In flight (requests)').textContent()).toContain('0 samples (n = 3)');
    expect(await page.locator('.setting-n').textContent()).toBe('3');
    expect(await page.locator('.shard-split').count()).toBe(0);
    expect(problems).toEqual([]);
    await page.screenshot({ path: `${SHOTS}units-n3-1024.png`, fullPage: true });
    await close();
  });
});
