import { existsSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, waitFor } from './support/server.js';

const CHROMIUM = '/usr/bin/chromium';
const ARTIFACTS = fileURLToPath(new URL('../test-artifacts/', import.meta.url));
const TOKEN = 'dashboard-test-token';
// Markup in a run name must show as text; the test checks it never becomes an element.
const RUN_NAME = 'qwen3 regen <b>bold</b>';

const haveChromium = existsSync(CHROMIUM);
if (!haveChromium) {
  if (process.env.CI === 'true') throw new Error(`${CHROMIUM} is missing: the dashboard test needs Debian's chromium on CI`);
  console.warn(`\n*** ${CHROMIUM} is missing: SKIPPING the dashboard test (apt-get install chromium to run it) ***\n`);
}

type TestServer = Awaited<ReturnType<typeof startTestServer>>;
let server: TestServer;
let sim: SimProcess;
let browser: Browser;
let runId: string;

const auth = { authorization: `Bearer ${TOKEN}` };

describe.skipIf(!haveChromium)('dashboard', () => {
  beforeAll(async () => {
    [server, sim] = await Promise.all([
      startTestServer({ REGEN_API_TOKENS: TOKEN }),
      // Slow enough that the run is still going while the page is looked at and paused.
      spawnSimulator({ 'max-running': 8, 'ttft-ms': 150, 'tokens-per-second': 300, 'degenerate-rate': 0.1, 'error-rate': 0.03 }),
    ]);
    const ep = await call(server.url, '/v1/endpoints', { method: 'POST', headers: auth, json: { url: sim.url, name: 'sim-a' } });
    expect(ep.status).toBe(201);
    const requests = Array.from({ length: 2000 }, (_, i) => ({
      custom_id: `q-${String(i).padStart(4, '0')}`,
      messages: [{ role: 'user', content: `Explain B-trees (question ${i}) <script>alert(1)</script>` }],
    }));
    const run = await call(server.url, '/v1/runs', {
      method: 'POST',
      headers: auth,
      json: {
        name: RUN_NAME,
        model: 'sim-model',
        input: { requests },
        shard_size: 100,
        max_attempts: 1,
        params: { temperature: 0.6, chat_template_kwargs: { enable_thinking: true } },
        quality: { retry_flagged: 0, gate: false },
      },
    });
    expect(run.status, JSON.stringify(run.body)).toBe(201);
    runId = run.body.id;
    await waitFor('the run to be under way with a rate', async () => {
      const r = await call(server.url, `/v1/runs/${runId}`, { headers: auth });
      return r.body.status === 'in_progress' && r.body.request_counts.completed >= 30 && r.body.progress.eta_seconds ? r.body : undefined;
    });
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'] });
  });

  afterAll(async () => {
    await browser?.close();
    if (server && runId) await call(server.url, `/v1/runs/${runId}/cancel`, { method: 'POST', headers: auth });
    await server?.cleanup();
    await sim?.stop();
  });

  it('serves the page publicly and its data only with the token', async () => {
    const page = await fetch(server.url + '/');
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toMatch(/^text\/html/);
    expect(page.headers.get('content-security-policy')).toContain("script-src 'self'");
    expect(await page.text()).toContain('/dashboard/app.js');
    const script = await fetch(server.url + '/dashboard/app.js');
    expect(script.status).toBe(200);
    expect(script.headers.get('content-type')).toMatch(/^text\/javascript/);
    expect((await fetch(server.url + '/dashboard/nope.js')).status).toBe(404);
    expect((await fetch(server.url + '/dashboard/..%2Fapp.ts')).status).toBe(404);
    // The data layer's one dependency, openapi-fetch's ES module build, from a fixed name.
    const vendored = await fetch(server.url + '/dashboard/vendor/openapi-fetch.js');
    expect(vendored.status).toBe(200);
    expect(vendored.headers.get('content-type')).toMatch(/^text\/javascript/);
    expect(await vendored.text()).toMatch(/export \{[^}]*createClient as default/);
    for (const name of ['index.mjs', '..%2Fapi.js', '..%2F..%2F..%2Fpackage.json', 'openapi-fetch.d.ts'])
      expect((await fetch(`${server.url}/dashboard/vendor/${name}`)).status, name).toBe(404);
    expect((await call(server.url, '/v1/runs')).status).toBe(401);
  });

  it('asks for the token, shows the run live, and pauses it', async () => {
    const context = await browser.newContext({ viewport: { width: 1360, height: 900 } });
    const page = await context.newPage();
    const problems: string[] = [];
    page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
    page.on('console', (msg) => {
      // The browser itself logs every 401 it sees; asking for the token starts with one.
      if (msg.type() === 'error' && !/status of 401/.test(msg.text())) problems.push(`console: ${msg.text()}`);
    });

    await page.goto(`${server.url}/#/runs/${runId}`);
    const dialog = page.locator('#token-dialog');
    await dialog.waitFor({ state: 'visible' });
    await page.fill('#token-input', TOKEN);
    await page.click('#token-dialog button[type=submit]');
    await dialog.waitFor({ state: 'hidden' });
    expect(await page.evaluate(() => localStorage.getItem('regen.token'))).toBe(TOKEN);

    const title = page.locator('.run-head h1');
    await expect.poll(() => title.textContent(), { timeout: 15_000 }).toBe(RUN_NAME);
    expect(await title.locator('b').count()).toBe(0);
    await expect.poll(() => page.locator('.big-pct').textContent(), { timeout: 15_000 }).toMatch(/^\d{1,3}\.\d%$/);
    const etaStat = page.locator('.stat', { hasText: 'ETA' }).locator('.value');
    await expect.poll(() => etaStat.textContent(), { timeout: 15_000 }).toMatch(/^(\d+[dhms] ?)+$/);
    await expect.poll(() => page.locator('#live').textContent(), { timeout: 15_000 }).toBe('live');
    await expect.poll(() => page.locator('.card', { hasText: 'Endpoints' }).locator('tbody tr').count(), { timeout: 15_000 }).toBe(1);
    await expect.poll(() => page.locator('.shard').count(), { timeout: 15_000 }).toBeGreaterThanOrEqual(20);

    // A few progress events draw the throughput chart; the percentage moves with them.
    const first = await page.locator('.big-pct').textContent();
    await expect.poll(() => page.locator('.big-pct').textContent(), { timeout: 20_000 }).not.toBe(first);
    // The forecast: its finish and interval, and the projected finish over time from the server's history.
    const forecast = page.locator('.card', { hasText: 'Forecast' });
    await expect
      .poll(() => forecast.locator('tr', { hasText: 'Time left' }).textContent(), { timeout: 15_000 })
      .toMatch(/^Time left\d+[dhms]( \d+[dhms])? to \d+[dhms]( \d+[dhms])? \(90%\)$/);
    await expect.poll(() => forecast.locator('tr', { hasText: 'Based on' }).textContent(), { timeout: 15_000 }).toMatch(/calibration answers \(slice of 200\)/);
    await expect
      .poll(async () => (await call(server.url, `/v1/runs/${runId}/forecasts`, { headers: auth })).body.data.length, { timeout: 20_000 })
      .toBeGreaterThanOrEqual(2);
    await page.waitForTimeout(4000);
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: `${ARTIFACTS}dashboard.png`, fullPage: true });

    // Against a server without the events route the page polls the run instead.
    const polling = await context.newPage();
    polling.on('pageerror', (err) => problems.push(`page error (polling): ${err.message}`));
    await polling.route('**/v1/runs/*/events', (route) =>
      route.fulfill({ status: 404, contentType: 'application/problem+json', body: '{"detail":"no route"}' }),
    );
    await polling.goto(`${server.url}/#/runs/${runId}`);
    await expect.poll(() => polling.locator('#live').textContent(), { timeout: 15_000 }).toBe('polling');
    const polled = await polling.locator('.big-pct').textContent();
    await expect.poll(() => polling.locator('.big-pct').textContent(), { timeout: 20_000 }).not.toBe(polled);
    await polling.close();

    await page.getByRole('button', { name: 'Pause', exact: true }).click();
    await waitFor(
      'the run to be paused',
      async () => {
        const r = await call(server.url, `/v1/runs/${runId}`, { headers: auth });
        return r.body.status === 'paused' ? r.body : undefined;
      },
      15_000,
    );
    await expect.poll(() => page.locator('.run-head .badge').textContent(), { timeout: 15_000 }).toBe('paused');
    expect(await page.getByRole('button', { name: 'Resume', exact: true }).isVisible()).toBe(true);

    // A flagged sample opens in the viewer with its messages, reasoning and content, as text.
    const example = page.locator('.examples a:not(.more)').first();
    await example.waitFor({ timeout: 15_000 });
    await example.click();
    await page.locator('.message.role-user pre').first().waitFor();
    expect(await page.locator('.message.role-user pre').first().textContent()).toContain('<script>alert(1)</script>');
    expect(await page.locator('.message.reasoning').count()).toBe(1);
    expect(await page.locator('.message.role-assistant').count()).toBeGreaterThan(0);
    await page.screenshot({ path: `${ARTIFACTS}dashboard-sample.png`, fullPage: true });

    // The list of a flag's samples: the filter and the page size go in the query.
    await page.goBack();
    await page.locator('.examples a.more').first().click();
    await expect.poll(() => page.locator('h1').textContent(), { timeout: 15_000 }).toMatch(/^Samples flagged \w+$/);
    await expect.poll(() => page.locator('tbody tr').count(), { timeout: 15_000 }).toBeGreaterThan(0);

    // The runs list, reached from the header, shows the run with its progress.
    await page.click('header a.brand');
    await expect.poll(() => page.locator('a.run-link').first().textContent(), { timeout: 15_000 }).toBe(RUN_NAME);
    await page.screenshot({ path: `${ARTIFACTS}dashboard-runs.png`, fullPage: true });

    expect(problems).toEqual([]);
    await context.close();
  });
});
