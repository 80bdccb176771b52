import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, REGEN, startTestServer } from './support/server.js';
import { createRun, registerEndpoint, waitForStatus } from './support/runner-checks.js';
import { Stores } from '../src/storage/index.js';

// The dashboard on conversation runs: a conversation's sample page shows every regenerated reply
// (tool-call steps and the source's results included) with how each request went, and where the
// line is written; a run whose answers were all cut ends in a warning, not in green.

const CHROMIUM = '/usr/bin/chromium';
const ARTIFACTS = fileURLToPath(new URL('../test-artifacts/', import.meta.url));
const haveChromium = existsSync(CHROMIUM);
if (!haveChromium && process.env.CI === 'true') throw new Error(`${CHROMIUM} is missing: the dashboard test needs Debian's chromium on CI`);

const TOOLS = [{ type: 'function', function: { name: 'search', description: 'search', parameters: { type: 'object', properties: {} } } }];
const TOOL_RESULT = 'the source result: B-trees keep keys sorted';
const USERS = ['What is a B-tree?', 'Look it up [tools=search]', 'Why are they wide?', 'Summarise in one line.'];

/** A 4-turn conversation whose second turn the target answers after one tool-call step, paired with the source's. */
function conversationLine(id: string) {
  const messages: Record<string, unknown>[] = [{ role: 'system', content: 'You are terse.' }];
  for (const [k, content] of USERS.entries()) {
    messages.push({ role: 'user', content });
    if (k === 1)
      messages.push(
        { role: 'assistant', content: null, tool_calls: [{ id: 'src-1', type: 'function', function: { name: 'search', arguments: '{"q":"b-tree"}' } }] },
        { role: 'tool', tool_call_id: 'src-1', content: TOOL_RESULT },
      );
    messages.push({ role: 'assistant', content: `an old reply ${k}` });
  }
  return { custom_id: id, messages, tools: TOOLS, source: 'forum <b>dump</b>' };
}

let server: Awaited<ReturnType<typeof startTestServer>>;
let sim: SimProcess;
let browser: Browser;

async function openPage(width: number): Promise<{ page: Page; problems: string[]; close(): Promise<void> }> {
  const context = await browser.newContext({ viewport: { width, height: 900 } });
  const page = await context.newPage();
  const problems: string[] = [];
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (msg) => {
    if (msg.type() === 'error') problems.push(`console: ${msg.text()}`);
  });
  return { page, problems, close: () => context.close() };
}

describe.skipIf(!haveChromium)('dashboard on conversation runs', () => {
  beforeAll(async () => {
    [server, sim] = await Promise.all([
      startTestServer(),
      spawnSimulator({ 'ttft-ms': 5, 'tokens-per-second': 4000, 'completion-tokens': 24, 'reasoning-tokens': 12 }),
    ]);
    await registerEndpoint(server.url, sim.url);
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'] });
  });

  afterAll(async () => {
    await browser?.close();
    await server?.cleanup();
    await sim?.stop();
  });

  it("shows every turn and step of a conversation's sample, its variant, split and shard", async () => {
    const created = await createRun(server.url, {
      model: 'sim-model',
      regenerate: 'all_assistant',
      input: { requests: Array.from({ length: 6 }, (_, i) => conversationLine(`conv-${i}`)) },
      output: { format: 'parquet' },
      split: { eval: 0.5 },
      variants: [{ name: 'cool', weight: 1, params: { temperature: 0.2 } }],
      quality: { gate: false },
    });
    await waitForStatus(server.url, created.id, ['completed']);
    const sample = (await call(server.url, `/v1/runs/${created.id}/sample?custom_id=conv-0`)).body;
    expect(sample.turns).toHaveLength(5);
    expect(sample.shard_key).toBe(`${sample.split}/shard-00000.parquet`);

    const { page, problems, close } = await openPage(1440);
    await page.goto(`${server.url}/#/runs/${created.id}/samples/conv-0`);
    const replies = page.locator('.conversation .reply');
    await expect.poll(() => replies.count(), { timeout: 15_000 }).toBe(5);
    // Each answer's content shows as text beside its request; the step shows its call, then the source's result under the target's id.
    for (const [i, t] of sample.turns.entries()) {
      const reply = replies.nth(i);
      const head = await reply.locator('.request-head').textContent();
      expect(head).toContain(t.finish_reason);
      expect(head).toContain(t.endpoint_id);
      expect(head).toContain(t.step > 0 || t.tool_calls ? `turn ${t.turn + 1}, step ${t.step + 1}` : `turn ${t.turn + 1}`);
      if (t.tool_calls) expect(await reply.locator('pre.tool-calls').textContent()).toContain(`${t.tool_calls[0].id}: search(`);
      else expect(await reply.locator('.message.role-assistant pre').textContent()).toBe(t.content);
      // The reasoning folds.
      expect(await reply.locator('details.reasoning').getAttribute('open')).toBeNull();
    }
    expect(await page.locator('.conversation .message.role-user').count()).toBe(4);
    const tool = page.locator('.conversation .message.role-tool');
    expect(await tool.count()).toBe(1);
    expect(await tool.locator('.role').textContent()).toBe(`tool → ${sample.turns[1].tool_calls[0].id}`);
    expect(await tool.locator('pre').textContent()).toBe(TOOL_RESULT);

    const stat = (label: string) => page.locator('.stat', { has: page.locator('.label', { hasText: label }) }).locator('.value');
    expect(await stat('Variant').textContent()).toBe('cool');
    expect(await stat('Split').textContent()).toBe(sample.split);
    expect(await stat('Shard').textContent()).toMatch(new RegExp(`^${sample.split}/shard-00000\\.parquet \\(line \\d+\\)$`));
    // The line's own fields, as text.
    expect(await page.locator('details', { hasText: 'Metadata' }).locator('pre').textContent()).toContain('forum <b>dump</b>');
    mkdirSync(ARTIFACTS, { recursive: true });
    await page.screenshot({ path: `${ARTIFACTS}sample-conversation-1440.png`, fullPage: true });
    await page.setViewportSize({ width: 1024, height: 900 });
    await page.screenshot({ path: `${ARTIFACTS}sample-conversation-1024.png`, fullPage: true });
    expect(problems).toEqual([]);
    await close();
  });

  it('ends a run of cut answers, shorter than the gate waits for, in a warning', async () => {
    // SpecForge's lines name themselves by `id`, often a row number.
    const short = (id: number) => ({
      id,
      messages: [
        { role: 'user', content: `Explain ${id}` },
        { role: 'assistant', content: 'old' },
        { role: 'user', content: 'And then?' },
      ],
    });
    const runOf = async (gate: boolean) => {
      const created = await createRun(server.url, {
        model: 'sim-model',
        regenerate: 'all_assistant',
        input: { requests: Array.from({ length: 40 }, (_, i) => short(gate ? i : 1000 + i)) },
        output: { format: 'conversations' },
        // Every answer is cut: the simulator writes 24 tokens.
        params: { max_tokens: 4 },
        quality: gate ? { retry_flagged: 0 } : { retry_flagged: 0, gate: false },
      });
      return waitForStatus(server.url, created.id, ['completed', 'paused', 'failed']);
    };
    const [gated, ungated] = await Promise.all([runOf(true), runOf(false)]);
    // Judged as a whole at its end by the gate's rules (40 conversations, fewer than its 200).
    expect(gated.status).toBe('completed');
    expect(gated.status_reason).toMatch(/^completed over the limit: .*truncated 100%.* of 40 samples \(flagged 100%, limit 20%\)$/);
    expect(gated.warnings).toEqual([{ code: 'quality_over_limit', field: 'quality.gate', message: gated.status_reason }]);
    // With the gate off: the warning only.
    expect(ungated.status).toBe('completed');
    expect(ungated.status_reason).toBeNull();
    expect(ungated.warnings?.[0]?.code).toBe('quality_over_limit');

    // In SpecForge's format every one of those lines says so, with its flags, under its numeric id.
    const store = new Stores({ forcePathStyle: false }).forUri(gated.output_uri);
    const lines = (await store.get('shard-00000.jsonl')).toString('utf8').trim().split('\n');
    expect(lines).toHaveLength(40);
    for (const [i, text] of lines.entries()) {
      const back = JSON.parse(text);
      expect(back).toMatchObject({ id: i, status: 'error' });
      expect(back.flags).toContain('truncated');
    }

    const { page, problems, close } = await openPage(1440);
    for (const run of [gated, ungated]) {
      await page.goto(`${server.url}/#/runs/${run.id}`);
      const status = page.locator('.run-head .badge').first();
      await expect.poll(() => status.textContent(), { timeout: 15_000 }).toBe('completed with warnings');
      expect(await status.getAttribute('class')).not.toMatch(/\bs-completed\b/);
      expect(await page.locator('.banner.warn').textContent()).toMatch(/truncated 100%.* of 40 samples/);
      expect(await page.locator('.bar .fill').first().getAttribute('class')).toContain('s-completed_with_warnings');
      // One unit: a conversation run counts its conversations, its chart's rate too.
      expect(await page.locator('body').textContent()).toContain('40 of 40 conversations done');
      expect(await page.locator('.legend').first().textContent()).toContain('conversations/s (left)');
    }
    await page.screenshot({ path: `${ARTIFACTS}run-warned-1440.png`, fullPage: true });
    await page.setViewportSize({ width: 1024, height: 900 });
    await page.screenshot({ path: `${ARTIFACTS}run-warned-1024.png`, fullPage: true });
    expect(problems).toEqual([]);
    await close();

    // The CLI says so too, in yellow on a terminal (here a pipe, so plain, as NO_COLOR asks).
    const child = spawn(process.execPath, [...REGEN, 'status', gated.id], {
      env: { ...process.env, REGEN_URL: server.url },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    expect((await once(child, 'exit'))[0]).toBe(0);
    expect(out).toMatch(/status\s+completed with warnings: completed over the limit: .*truncated 100%/);
    expect(out).toMatch(/progress\s+100\.0%, 40 of 40 conversations done/);
    expect(out).toMatch(/rate\s+[\d.]+ conversations\/s/);
  });
});
