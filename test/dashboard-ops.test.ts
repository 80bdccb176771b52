import { existsSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HISTORY_STEP_MS } from '../src/domain/history.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, waitFor } from './support/server.js';

const CHROMIUM = '/usr/bin/chromium';
const ARTIFACTS = fileURLToPath(new URL('../test-artifacts/', import.meta.url));
/** The narrowest width the page is laid out for, and a common laptop's. */
const WIDTHS = [1024, 1440];
/** A card with a heading, a line of counts and a row of cells: about 100 px (it was as tall as the chart beside it, 300 px). */
const SHARDS_CARD_MAX_PX = 140;
/** Runs the runs list shows a page (src/dashboard/runs.js). */
const PAGE_SIZE = 50;

const haveChromium = existsSync(CHROMIUM);
if (!haveChromium && process.env.CI === 'true') throw new Error(`${CHROMIUM} is missing: the dashboard test needs Debian's chromium on CI`);

type TestServer = Awaited<ReturnType<typeof startTestServer>>;
let server: TestServer;
let sim: SimProcess;
let dead: SimProcess;
/** A name as long as real fleets' (a host name), which the endpoints table must fit. */
const DEAD_NAME = 'gpu-node-17.us-east-2.cluster.internal';
/** The dead server's first reported error, and its last load reading. */
let firstError: string;
let lastRead: string;
let browser: Browser;
let finished: any;
let cancelled: any;

const requests = (n: number, prefix: string) =>
  Array.from({ length: n }, (_, i) => ({ custom_id: `${prefix}-${i}`, messages: [{ role: 'user', content: `Explain ${prefix} ${i % 50}` }] }));

async function createRun(body: Record<string, unknown>) {
  const r = await call(server.url, '/v1/runs', { method: 'POST', json: { model: 'sim-model', quality: false, ...body } });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.id as string;
}

const runOf = async (id: string) => (await call(server.url, `/v1/runs/${id}`)).body;

/** Tables wider than the inside of the card they sit in: none should be, at any width the page is laid out for. */
const overflowing = (page: Page) =>
  page.evaluate(() =>
    [...document.querySelectorAll('.card table')].flatMap((t) => {
      const card = t.closest('.card') as HTMLElement;
      const style = getComputedStyle(card);
      const inside = card.clientWidth - Number.parseFloat(style.paddingLeft) - Number.parseFloat(style.paddingRight);
      if (t.scrollWidth <= inside) return [];
      // What each column holds at its widest, so a failure names what pushed the table out.
      const widest = [...t.querySelectorAll('tr')]
        .flatMap((tr) => [...tr.children])
        .reduce((w: Record<number, string>, cell) => {
          const i = (cell as HTMLTableCellElement).cellIndex;
          const width = (cell as HTMLElement).offsetWidth;
          if (!w[i] || width > Number(w[i].split(' ')[0])) w[i] = `${width} ${JSON.stringify(cell.textContent)}`;
          return w;
        }, {});
      return [`${card.querySelector('h2')?.textContent ?? 'runs'}: ${t.scrollWidth} > ${inside}; widest cells: ${Object.values(widest).join(' | ')}`];
    }),
  );

describe.skipIf(!haveChromium)('the operator’s dashboard', () => {
  beforeAll(async () => {
    [server, sim, dead] = await Promise.all([
      startTestServer(),
      spawnSimulator({ 'max-running': 8, 'ttft-ms': 100, 'tokens-per-second': 200, 'enable-cache-report': 1 }),
      spawnSimulator({ model: 'other-model' }),
    ]);
    expect((await call(server.url, '/v1/endpoints', { method: 'POST', json: { url: sim.url, name: 'sim-a' } })).status).toBe(201);
    // A server that answers, is read, then dies: its health must say so from the first failed probe.
    const ep = (await call(server.url, '/v1/endpoints', { method: 'POST', json: { url: dead.url, name: DEAD_NAME } })).body;
    await waitFor('the second server to be ready with a load reading', async () => {
      const e = (await call(server.url, `/v1/endpoints/${ep.id}`)).body;
      return e.state === 'ready' && e.server.read_at ? e : undefined;
    });
    dead.proc.kill('SIGKILL');
    const failed = await waitFor(
      'the dead server’s first failed probe',
      async () => {
        const e = (await call(server.url, `/v1/endpoints/${ep.id}`)).body;
        return e.last_error ? e : undefined;
      },
      30_000,
      20,
    );
    firstError = failed.last_error;
    lastRead = failed.server.read_at;
    // 16 waves of the simulator's 8 slots at about 0.4 s each: longer than a history point, so the
    // finished run is drawn from at least two of them.
    const done = await createRun({ name: 'finished run', input: { requests: requests(128, 'done') } });
    finished = await waitFor('the first run to complete', async () => {
      const r = await runOf(done);
      return r.status === 'completed' ? r : undefined;
    });
    // Its last answers are in the history once the recorder's next point is.
    await waitFor('the whole run in its history', async () => {
      const h = (await call(server.url, `/v1/runs/${done}/history`)).body.data as { samples: number }[];
      return h.reduce((s, p) => s + p.samples, 0) === finished.request_counts.completed ? h : undefined;
    });
    const stop = await createRun({ name: 'cancelled run', input: { requests: requests(2000, 'stop') } });
    await waitFor('the second run to be under way', async () => ((await runOf(stop)).request_counts.completed >= 20 ? true : undefined));
    expect((await call(server.url, `/v1/runs/${stop}/cancel`, { method: 'POST' })).status).toBe(200);
    cancelled = await waitFor('the second run to be cancelled', async () => {
      const r = await runOf(stop);
      return r.status === 'cancelled' ? r : undefined;
    });
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'] });
    // Two runs end to end, one dead server: minutes on a loaded machine.
  }, 300_000);

  afterAll(async () => {
    await browser?.close();
    await server?.cleanup();
    await sim?.stop();
    await dead?.stop();
  });

  it('shows a dead server as refusing connections from its first failed probe, its last load greyed with its age, alike on every page', async () => {
    // Refused, reset when the kill landed in the middle of a probe, or closed when it landed on a
    // kept-alive connection between probes: never a bare "fetch failed".
    expect(firstError).toMatch(/^connection (refused|reset|closed by the server)/);
    expect(Date.parse(lastRead)).toBeGreaterThan(0);
    const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
    for (const path of ['#/', `#/runs/${finished.id}`]) {
      await page.goto(`${server.url}/${path}`);
      const row = page.locator('tr', { hasText: DEAD_NAME });
      await expect.poll(() => row.locator('.error').textContent(), { timeout: 15_000 }).toMatch(/^connection (refused|reset)/);
      expect(await row.locator('.stale .last-seen').textContent(), path).toMatch(/^last seen \d+[dhms]( \d+[dhms])? ago$/);
    }
    // The live server's figures are its load now: not greyed.
    expect(await page.locator('tr', { hasText: 'sim-a' }).locator('.stale').count()).toBe(0);
    await page.close();
  });

  it('draws the whole of a finished run from the server, with its average rate and duration', async () => {
    const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
    await page.goto(`${server.url}/#/runs/${finished.id}`);
    const canvas = page.locator('canvas[aria-label="throughput over time"]');
    await expect.poll(() => canvas.getAttribute('data-points'), { timeout: 15_000 }).not.toMatch(/^[01]?$/);
    const from = Date.parse((await canvas.getAttribute('data-from'))!);
    const to = Date.parse((await canvas.getAttribute('data-to'))!);
    // Its first point starts within a point of the start, its last ends after the finish.
    expect(from).toBeLessThanOrEqual(Date.parse(finished.started_at) + HISTORY_STEP_MS);
    expect(to).toBeGreaterThanOrEqual(Date.parse(finished.finished_at));
    const rate = page.locator('.stat', { hasText: 'Average rate' }).locator('.value');
    await expect.poll(() => rate.textContent(), { timeout: 15_000 }).toMatch(/^[1-9][\d.,]* samples\/s$/);
    expect(await page.locator('.stat', { hasText: 'Took' }).count()).toBe(1);
    expect(await page.locator('.card.forecast').textContent()).not.toMatch(/0s to 0s/);
    await page.close();
  });

  it('shows a cancelled run’s answered share, not its total', async () => {
    const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
    await page.goto(`${server.url}/#/runs/${cancelled.id}`);
    const share = cancelled.request_counts.completed / cancelled.request_counts.total;
    expect(share).toBeLessThan(0.9);
    await expect.poll(() => page.locator('.big-pct').textContent(), { timeout: 15_000 }).toBe(`${(100 * share).toFixed(1)}%`);
    expect(Number(await page.locator('.progress-card [role=progressbar]').getAttribute('aria-valuenow'))).toBeCloseTo(100 * share, 1);
    expect(await page.locator('.progress-line').textContent()).toContain(
      `${cancelled.request_counts.completed.toLocaleString('en-US')} of 2,000 samples answered`,
    );
    await page.goto(`${server.url}/#/`);
    const row = page.locator('tr', { hasText: 'cancelled run' });
    await expect.poll(() => row.locator('.pct').textContent(), { timeout: 15_000 }).toBe(`${(100 * share).toFixed(1)}%`);
    await page.close();
  });

  it('filters the runs list by status and name', async () => {
    const page = await browser.newPage({ viewport: { width: 1024, height: 900 } });
    await page.goto(`${server.url}/#/`);
    const links = page.locator('a.run-link');
    await expect.poll(() => links.count(), { timeout: 15_000 }).toBe(2);
    await page.selectOption('select[aria-label=status]', 'cancelled');
    await expect.poll(() => links.allTextContents(), { timeout: 15_000 }).toEqual(['cancelled run']);
    await page.selectOption('select[aria-label=status]', '');
    await page.fill('input[aria-label=name]', 'FINISHED');
    await expect.poll(() => links.allTextContents(), { timeout: 15_000 }).toEqual(['finished run']);
    await page.fill('input[aria-label=name]', '100%_');
    await expect.poll(() => page.locator('.card').first().textContent(), { timeout: 15_000 }).toContain('No run matches these filters.');
    await page.close();
  });

  it('fits every table in its card at 1024 and 1440 px, and saves the run page at both', async () => {
    mkdirSync(ARTIFACTS, { recursive: true });
    for (const width of WIDTHS) {
      const page = await browser.newPage({ viewport: { width, height: 900 } });
      await page.goto(`${server.url}/#/`);
      await expect.poll(() => page.locator('a.run-link').count(), { timeout: 15_000 }).toBe(2);
      await expect.poll(() => page.locator('.card', { hasText: 'sim-a' }).count(), { timeout: 15_000 }).toBeGreaterThan(0);
      expect(await overflowing(page), `runs list at ${width}px`).toEqual([]);
      await page.goto(`${server.url}/#/runs/${finished.id}`);
      await expect.poll(() => page.locator('.card', { hasText: 'Endpoints' }).locator('tbody tr').count(), { timeout: 15_000 }).toBe(2);
      // At its widest: the run's flagged share by endpoint joins the table once the page has read the run's quality.
      await expect.poll(() => page.locator('table.endpoints th', { hasText: 'Flagged (run)' }).count(), { timeout: 15_000 }).toBe(1);
      // No flag occurred: the quality panel folds all of them into one line.
      await expect
        .poll(() => page.locator('.quality-rest summary').textContent(), { timeout: 15_000 })
        .toMatch(/^No completed sample has any of the \d+ flags$/);
      expect(await page.locator('.card', { hasText: 'Quality' }).locator('table').count()).toBe(0);
      // The shards take the room they need: a line of counts and a cell each, not a card as tall as a chart.
      const shards = page.locator('.shards-card');
      await expect.poll(() => shards.locator('.shard-summary').textContent(), { timeout: 15_000 }).toBe(' 1 uploaded 0 writing 0 in progress 0 waiting');
      expect(await shards.locator('.shard-grid .shard.uploaded').count()).toBe(1);
      expect((await shards.boundingBox())!.height, `shards card at ${width}px`).toBeLessThan(SHARDS_CARD_MAX_PX);
      expect(await overflowing(page), `run page at ${width}px`).toEqual([]);
      expect(await page.evaluate(() => document.documentElement.scrollWidth), `the page at ${width}px`).toBeLessThanOrEqual(width);
      await page.screenshot({ path: `${ARTIFACTS}run-${width}.png`, fullPage: true });
      await page.close();
    }
  });

  it('pages the runs list, newest first, and pages within a filter', async () => {
    // Runs past a page: waiting for a model no endpoint serves, so they stay queued.
    const waiting = 55;
    for (let i = 0; i < waiting; i++) await createRun({ name: `waiting ${i}`, model: 'unserved-model', input: { requests: requests(1, `w${i}`) } });
    await waitFor('every waiting run to be queued', async () => {
      const r = await call(server.url, '/v1/runs?status=queued&limit=100');
      return r.body.data.length === waiting ? true : undefined;
    });
    const page = await browser.newPage({ viewport: { width: 1024, height: 900 } });
    await page.goto(`${server.url}/#/`);
    const links = page.locator('a.run-link');
    const newer = page.getByRole('button', { name: '← Newer' });
    const older = page.getByRole('button', { name: 'Older →' });
    const pageNo = page.locator('.filters .small.muted');
    const names = (from: number, to: number) => Array.from({ length: from - to + 1 }, (_, i) => `waiting ${from - i}`);

    await expect.poll(() => links.count(), { timeout: 15_000 }).toBe(PAGE_SIZE);
    expect(await links.allTextContents()).toEqual(names(waiting - 1, waiting - PAGE_SIZE));
    expect(await pageNo.textContent()).toBe('page 1');
    expect(await newer.isHidden()).toBe(true);
    await older.click();
    await expect.poll(() => links.allTextContents(), { timeout: 15_000 }).toEqual([...names(waiting - PAGE_SIZE - 1, 0), 'cancelled run', 'finished run']);
    expect(await pageNo.textContent()).toBe('page 2');
    expect(await older.isHidden()).toBe(true);
    await newer.click();
    await expect.poll(() => links.count(), { timeout: 15_000 }).toBe(PAGE_SIZE);
    expect(await links.first().textContent()).toBe(`waiting ${waiting - 1}`);

    // A filter starts again from its newest page, and pages on its own.
    await older.click();
    await expect.poll(() => pageNo.textContent(), { timeout: 15_000 }).toBe('page 2');
    await page.selectOption('select[aria-label=status]', 'queued');
    await expect.poll(() => links.count(), { timeout: 15_000 }).toBe(PAGE_SIZE);
    expect(await pageNo.textContent()).toBe('page 1');
    await older.click();
    await expect.poll(() => links.allTextContents(), { timeout: 15_000 }).toEqual(names(waiting - PAGE_SIZE - 1, 0));
    await page.fill('input[aria-label=name]', 'waiting 5');
    await expect
      .poll(() => links.allTextContents(), { timeout: 15_000 })
      .toEqual(['waiting 54', 'waiting 53', 'waiting 52', 'waiting 51', 'waiting 50', 'waiting 5']);
    expect(await pageNo.textContent()).toBe('');
    expect(await older.isHidden()).toBe(true);
    await page.close();
  });
});
