// Signed webhooks from the outbox, against a real receiver on loopback and regen as its own
// process (so that it can be killed between an event and its delivery).
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { expectProblem, request } from './support/http.js';
import { createRun, getRun, makePrompts, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './support/server.js';
import { openTestStore } from './support/store.js';

const secret = () => `whsec_${randomBytes(32).toString('base64')}`;
const SERVER_SECRET = secret();
/** Attempts before an event is given up: the receiver that fails three times is answered on the last. */
const MAX_ATTEMPTS = 4;
/** The attempt timeout of the server killed with an attempt out: the restart waits out its lease. */
const HELD_TIMEOUT_MS = 5000;

/** What the receiver saw of one POST, and whether its signature held under the secret it was meant for. */
interface Received {
  path: string;
  id: string;
  timestamp: number;
  body: string;
  event: any;
  verified: boolean;
}

/** Verifies a Standard Webhooks signature as a receiver would, independently of regen's code. */
function verify(secretText: string, headers: IncomingMessage['headers'], body: string): boolean {
  const id = String(headers['webhook-id'] ?? '');
  const timestamp = String(headers['webhook-timestamp'] ?? '');
  const signatures = String(headers['webhook-signature'] ?? '').split(' ');
  if (!id || !/^\d+$/.test(timestamp)) return false;
  // The spec's replay window: a timestamp more than five minutes off is refused.
  if (Math.abs(Date.now() / 1000 - Number(timestamp)) > 300) return false;
  const key = Buffer.from(secretText.slice('whsec_'.length), 'base64');
  const expected = createHmac('sha256', key).update(`${id}.${timestamp}.${body}`).digest();
  return signatures.some((s) => {
    const [version, b64] = s.split(',');
    const got = Buffer.from(b64 ?? '', 'base64');
    return version === 'v1' && got.length === expected.length && timingSafeEqual(got, expected);
  });
}

type Behaviour = (req: Received, res: ServerResponse) => void;

/** A webhook receiver: each path has its secret and its way of answering; every POST is kept. */
class Receiver {
  readonly received: Received[] = [];
  private readonly secrets = new Map<string, string>();
  private readonly behaviours = new Map<string, Behaviour>();
  private server!: Server;
  url = '';

  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        const path = req.url ?? '';
        const r: Received = {
          path,
          id: String(req.headers['webhook-id']),
          timestamp: Number(req.headers['webhook-timestamp']),
          body,
          event: JSON.parse(body),
          verified: verify(this.secrets.get(path) ?? '', req.headers, body),
        };
        this.received.push(r);
        const answer = this.behaviours.get(path) ?? ((_r, res) => res.writeHead(204).end());
        answer(r, res);
      });
    });
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** A new path on the receiver, with its own secret. */
  hook(path: string, behaviour?: Behaviour): { url: string; secret: string } {
    const s = secret();
    this.secrets.set(path, s);
    if (behaviour) this.behaviours.set(path, behaviour);
    return { url: this.url + path, secret: s };
  }

  setSecret(path: string, s: string): void {
    this.secrets.set(path, s);
  }

  setBehaviour(path: string, behaviour: Behaviour): void {
    this.behaviours.set(path, behaviour);
  }

  at(path: string): Received[] {
    return this.received.filter((r) => r.path === path);
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((r) => this.server.close(r));
  }
}

const receiver = new Receiver();
const data = tempDir('regen-webhooks-');
let sim: SimProcess;
const extraSims: SimProcess[] = [];
let server: ServerProcess;
/** Every response body the tests saw, to prove no secret is ever in one. */
const seen: string[] = [];
const secrets: string[] = [SERVER_SECRET];
/** The output of server processes that were killed; the live one's is read at the end. */
const logs: string[] = [];

const env = () => ({
  REGEN_WEBHOOK_URL: `${receiver.url}/default`,
  REGEN_WEBHOOK_SECRET: SERVER_SECRET,
  REGEN_WEBHOOK_RETRY_MS: '100',
  // Far above a loopback receiver's answer on a loaded machine: an attempt that timed out would be one more failure.
  REGEN_WEBHOOK_TIMEOUT_MS: '10000',
  REGEN_WEBHOOK_MAX_ATTEMPTS: String(MAX_ATTEMPTS),
});

async function api(path: string, init: RequestInit & { json?: unknown } = {}) {
  const res = await call(server.url, path, init);
  seen.push(typeof res.body === 'string' ? res.body : JSON.stringify(res.body));
  return res;
}

/** A run of a few prompts with this webhook (or none: the server's default). */
async function startRun(webhook?: { url: string; secret: string }, model = 'sim-model') {
  if (webhook) secrets.push(webhook.secret);
  const fileId = await uploadFile(server.url, makePrompts(5, 'w').jsonl);
  const run = await createRun(server.url, { model, input: { file_id: fileId }, ...(webhook ? { webhook } : {}) });
  seen.push(JSON.stringify(run));
  return run;
}

const arrivals = (path: string, n: number) =>
  waitFor(`${n} webhook POST(s) at ${path}`, () => (receiver.at(path).length >= n ? receiver.at(path) : undefined), 60_000, 50);

beforeAll(async () => {
  await receiver.start();
  receiver.setSecret('/default', SERVER_SECRET);
  sim = await spawnSimulator({ 'ttft-ms': 5, 'tokens-per-second': 5000 });
  server = await spawnServer(data.dir, env());
  await registerEndpoint(server.url, sim.url);
});

afterAll(async () => {
  await server?.kill('SIGKILL');
  await Promise.all([sim, ...extraSims].map((s) => s?.stop()));
  await receiver.stop();
  data.cleanup();
});

describe('webhooks', () => {
  it("sends a run's completion to its own webhook, signed with its secret, and shows the delivery on the run", async () => {
    const hook = receiver.hook('/own');
    const run = await startRun(hook);
    expect(run.webhook).toEqual({ url: hook.url, source: 'run', secret_set: true, deliveries: { pending: 0, delivered: 0, failed: 0 }, last_error: null });
    await waitForStatus(server.url, run.id, ['completed']);
    const [got] = await arrivals('/own', 1);
    expect(got.verified).toBe(true);
    expect(got.event).toEqual({
      id: got.id,
      object: 'event',
      created_at: expect.any(Number),
      type: 'run.completed',
      data: { id: run.id, status_reason: null },
    });
    const after = await waitFor('the delivery on the run', async () => {
      const r = (await api(`/v1/runs/${run.id}`)).body;
      return r.webhook.deliveries.delivered === 1 ? r : undefined;
    });
    expect(after.webhook).toMatchObject({ deliveries: { pending: 0, delivered: 1, failed: 0 }, last_error: null });
    // The server's default heard nothing of a run with a webhook of its own.
    expect(receiver.at('/default').filter((r) => r.event.data.id === run.id)).toEqual([]);
  });

  it("sends a run without a webhook to the server's default, and a pause with its reason, then the cancel", async () => {
    // No endpoint serves this model: the run waits queued, to be paused and cancelled by hand.
    const run = await startRun(undefined, 'unserved-model');
    // The server's URL is the operator's: a caller sees its origin, not its path (tokens live there).
    expect(run.webhook).toMatchObject({ url: receiver.url, source: 'server', secret_set: true });
    await waitForStatus(server.url, run.id, ['queued']);
    expect((await api(`/v1/runs/${run.id}/pause`, { method: 'POST' })).status).toBe(200);
    expect((await api(`/v1/runs/${run.id}/cancel`, { method: 'POST' })).status).toBe(200);
    await waitForStatus(server.url, run.id, ['cancelled']);
    const mine = await waitFor('both events at the default', () => {
      const m = receiver.at('/default').filter((r) => r.event.data.id === run.id);
      return m.length >= 2 ? m : undefined;
    });
    // Due together, the two are delivered side by side: they may arrive in either order.
    expect(mine.map((r) => r.event.type).sort()).toEqual(['run.cancelled', 'run.paused']);
    expect(mine.every((r) => r.verified)).toBe(true);
    expect(new Set(mine.map((r) => r.id)).size).toBe(2);
    expect(mine.find((r) => r.event.type === 'run.paused')?.event.data).toEqual({ id: run.id, status_reason: null });
  });

  it('answers a receiver that fails three times on the fourth try, always with the one event id', async () => {
    let failures = 0;
    const hook = receiver.hook('/flaky', (_r, res) => {
      if (failures < 3) {
        failures++;
        res.writeHead(500).end('not now');
      } else res.writeHead(200).end('ok');
    });
    const run = await startRun(hook);
    await waitForStatus(server.url, run.id, ['completed']);
    const got = await arrivals('/flaky', 4);
    const after = await waitFor('the delivery on the run', async () => {
      const r = (await api(`/v1/runs/${run.id}`)).body;
      return r.webhook.deliveries.pending === 0 ? r : undefined;
    });
    expect(after.webhook.deliveries).toEqual({ pending: 0, delivered: 1, failed: 0 });
    expect(receiver.at('/flaky')).toHaveLength(4);
    expect(new Set(got.map((r) => r.id)).size).toBe(1);
    expect(new Set(got.map((r) => r.body)).size).toBe(1);
    expect(got.every((r) => r.verified)).toBe(true);
    expect(got[0].event.type).toBe('run.completed');
  });

  it('gives an event up after the last attempt and says why on the run', async () => {
    const hook = receiver.hook('/down', (_r, res) => res.writeHead(503).end());
    const run = await startRun(hook);
    await waitForStatus(server.url, run.id, ['completed']);
    const after = await waitFor('the event given up', async () => {
      const r = (await api(`/v1/runs/${run.id}`)).body;
      return r.webhook.deliveries.failed === 1 ? r : undefined;
    });
    expect(after.webhook).toMatchObject({
      deliveries: { pending: 0, delivered: 0, failed: 1 },
      last_error: `HTTP 503 (attempt ${MAX_ATTEMPTS} of ${MAX_ATTEMPTS})`,
    });
    expect(receiver.at('/down')).toHaveLength(MAX_ATTEMPTS);
    const metrics = String((await call(server.url, '/metrics')).body);
    expect(metrics).toContain('regen_webhook_events{status="failed"} 1');
    expect(metrics).toMatch(/regen_webhook_attempts_total\{result="failed"\} 1\n/);
    expect(Number(/regen_webhook_attempts_total\{result="retry"\} (\d+)/.exec(metrics)?.[1])).toBeGreaterThanOrEqual(MAX_ATTEMPTS - 1);
  });

  it("sends a batch's end under OpenAI's event name and shape", async () => {
    const hook = receiver.hook('/batch');
    secrets.push(hook.secret);
    const line = (i: number) =>
      JSON.stringify({
        custom_id: `b-${i}`,
        method: 'POST',
        url: '/v1/chat/completions',
        body: { model: 'sim-model', messages: [{ role: 'user', content: `q ${i}` }] },
      });
    const fileId = await uploadFile(server.url, `${[0, 1, 2].map(line).join('\n')}\n`, 'batch.jsonl');
    const batch = await api('/v1/batches', {
      method: 'POST',
      json: { input_file_id: fileId, endpoint: '/v1/chat/completions', completion_window: '24h', webhook: hook },
    });
    expect(batch.status, JSON.stringify(batch.body)).toBe(200);
    const [got] = await arrivals('/batch', 1);
    expect(got.verified).toBe(true);
    expect(got.event).toEqual({ id: got.id, object: 'event', created_at: expect.any(Number), type: 'batch.completed', data: { id: batch.body.id } });
    expect((await api(`/v1/batches/${batch.body.id}`)).body.status).toBe('completed');
  });

  it("tells the server's default and the run's own webhook of an endpoint the quality gate quarantines", async () => {
    // Two good servers and one that answers "OK." 87% of the time, under a limit of 50%: the bad one
    // is far over it while its peers are clean, yet the run's share (about 29%) stays under it.
    const model = 'q-model';
    const fleet = await Promise.all([1, 2].map((seed) => spawnSimulator({ model, seed, 'ttft-ms': 5, 'tokens-per-second': 5000 })));
    const bad = await spawnSimulator({ model, seed: 9, 'degenerate-rate': 0.87, 'ttft-ms': 5, 'tokens-per-second': 5000 });
    extraSims.push(...fleet, bad);
    for (const s of fleet) await registerEndpoint(server.url, s.url);
    const badEp = await registerEndpoint(server.url, bad.url);
    const hook = receiver.hook('/quarantine');
    secrets.push(hook.secret);
    const fileId = await uploadFile(server.url, makePrompts(600, 'q').jsonl);
    const run = await createRun(server.url, {
      model,
      input: { file_id: fileId },
      regenerate: 'last_assistant',
      quality: { gate: { max_flag_rate: 0.5 } },
      params: { chat_template_kwargs: { enable_thinking: true } },
      webhook: hook,
    });
    const [own] = await waitFor("the quarantine at the run's webhook", () => {
      const q = receiver.at('/quarantine').filter((r) => r.event.type === 'endpoint.quarantined');
      return q.length ? q : undefined;
    }).catch(async (err: Error) => {
      // Seen once in a full run (2026-12-07) and not since, alone or under load: what the run, the
      // endpoints and the receiver stood at, for the next time.
      const r = await getRun(server.url, run.id);
      const seen = {
        run: { status: r.status, status_reason: r.status_reason, request_counts: r.request_counts },
        endpoints: (await call(server.url, '/v1/endpoints')).body.data.map((e: Record<string, unknown>) => [e.url, e.state, e.last_error]),
        arrivals: receiver.at('/quarantine').map((r) => r.event.type),
        answered: await Promise.all([...fleet, bad].map(async (s) => (await s.stats()).completed)),
      };
      throw new Error(`${err.message}: ${JSON.stringify(seen)}`);
    });
    expect(own.verified).toBe(true);
    expect(own.event.data).toEqual({ id: badEp.id, url: badEp.url, reason: expect.stringMatching(/^quality gate: endpoint /), run_ids: [run.id] });
    const [server_] = await waitFor('the quarantine at the default', () => {
      const q = receiver.at('/default').filter((r) => r.event.type === 'endpoint.quarantined');
      return q.length ? q : undefined;
    });
    expect(server_.verified).toBe(true);
    expect(server_.event.data).toMatchObject({ id: badEp.id, run_ids: [run.id] });
    expect(server_.id).not.toBe(own.id);
    await waitForStatus(server.url, run.id, ['completed']);
  });

  it('sends run.failed with the reason when validation fails the run', async () => {
    const hook = receiver.hook('/failed');
    secrets.push(hook.secret);
    const fileId = await uploadFile(server.url, 'not json at all\n');
    const run = await createRun(server.url, { model: 'sim-model', input: { file_id: fileId }, webhook: hook });
    const failed = await waitForStatus(server.url, run.id, ['failed']);
    const [got] = await arrivals('/failed', 1);
    expect(got.verified).toBe(true);
    expect(got.event).toMatchObject({ type: 'run.failed', data: { id: run.id, status_reason: failed.status_reason } });
    expect(failed.status_reason).toEqual(expect.any(String));
  });

  it('sends batch.expired when the completion window ends a batch', async () => {
    // An endpoint that never comes up has not said what it serves, so a batch for any model is
    // accepted, and waits: nothing can answer it before its window ends.
    await registerEndpoint(server.url, 'http://127.0.0.1:9');
    const hook = receiver.hook('/expired');
    secrets.push(hook.secret);
    const line = JSON.stringify({
      custom_id: 'x-0',
      method: 'POST',
      url: '/v1/chat/completions',
      body: { model: 'nobody-serves', messages: [{ role: 'user', content: 'q' }] },
    });
    const fileId = await uploadFile(server.url, `${line}\n`, 'expire.jsonl');
    const batch = await api('/v1/batches', {
      method: 'POST',
      json: { input_file_id: fileId, endpoint: '/v1/chat/completions', completion_window: '24h', webhook: hook },
    });
    expect(batch.status, JSON.stringify(batch.body)).toBe(200);
    await waitFor('the batch in progress', async () => ((await api(`/v1/batches/${batch.body.id}`)).body.status === 'in_progress' ? true : undefined));
    // The window is 24 hours; move its end to now rather than wait.
    const db = await openTestStore(data.dir);
    await db.write((w) => w.exec('update runs set expires_at = ? where batch_id = ?', [Date.now() - 1000, batch.body.id]));
    await db.close();
    const [got] = await arrivals('/expired', 1);
    expect(got.verified).toBe(true);
    expect(got.event).toEqual({ id: got.id, object: 'event', created_at: expect.any(Number), type: 'batch.expired', data: { id: batch.body.id } });
    expect((await api(`/v1/batches/${batch.body.id}`)).body.status).toBe('expired');
  });

  it('refuses a webhook URL that breaks the endpoint URL rules, and a malformed secret, naming the field', async () => {
    const fileId = await uploadFile(server.url, makePrompts(1, 'bad').jsonl);
    const good = receiver.hook('/never');
    for (const url of [
      'http://169.254.169.254/latest/meta-data/',
      'http://[::ffff:a9fe:a9fe]/',
      'file:///etc/passwd',
      'http://user:pw@127.0.0.1/hook',
      'not a url',
    ]) {
      const res = await request(server.url, '/v1/runs', {
        method: 'POST',
        json: { model: 'sim-model', input: { file_id: fileId }, webhook: { ...good, url } },
      });
      expectProblem(res, 422, { field: 'webhook.url', hidden: [good.secret] });
      const batch = await request(server.url, '/v1/batches', {
        method: 'POST',
        json: { input_file_id: fileId, endpoint: '/v1/chat/completions', completion_window: '24h', webhook: { ...good, url } },
      });
      // The Batch routes answer a refused parameter as OpenAI does: 400, with the same problem fields.
      expectProblem(batch, 400, { field: 'webhook.url', hidden: [good.secret] });
      expect(batch.body.error).toMatchObject({ type: 'invalid_request_error', param: 'webhook.url' });
    }
    const short = `whsec_${randomBytes(8).toString('base64')}`;
    for (const s of [short, 'plain-text-secret-of-enough-length-000', `whsec_${'!'.repeat(40)}`]) {
      const res = await request(server.url, '/v1/runs', {
        method: 'POST',
        json: { model: 'sim-model', input: { file_id: fileId }, webhook: { url: good.url, secret: s } },
      });
      expectProblem(res, 422, { field: 'webhook.secret', hidden: [s] });
    }
    const missing = await request(server.url, '/v1/runs', {
      method: 'POST',
      json: { model: 'sim-model', input: { file_id: fileId }, webhook: { url: good.url } },
    });
    expectProblem(missing, 422, { field: 'webhook.secret' });
    expect(receiver.at('/never')).toEqual([]);
  });

  it('after kill -9 with an attempt out, sends the event again after the restart under the same id', async () => {
    // The attempt left out is leased for its timeout and a margin, and the restarted server sends it
    // again once that lease lapses: the server killed here gets a short timeout, so the lease is not
    // the file's generous one.
    logs.push(server.output());
    await server.kill('SIGTERM');
    server = await spawnServer(data.dir, { ...env(), REGEN_WEBHOOK_TIMEOUT_MS: String(HELD_TIMEOUT_MS) });
    let killed = false;
    // What reaches the receiver before regen is killed is never answered: regen dies while it waits.
    const hook = receiver.hook('/held', (_r, res) => {
      if (killed) res.writeHead(200).end();
    });
    const run = await startRun(hook);
    await waitForStatus(server.url, run.id, ['completed']);
    const [first] = await arrivals('/held', 1);
    logs.push(server.output());
    await server.kill('SIGKILL');
    killed = true;
    // Everything that arrives from here on comes from the new process.
    const beforeRestart = receiver.at('/held').length;
    // The kill landed with the one attempt out, before the killed process timed it out and sent it again.
    expect(beforeRestart).toBe(1);
    server = await spawnServer(data.dir, env());
    const got = await arrivals('/held', beforeRestart + 1);
    expect(new Set(got.map((r) => r.id))).toEqual(new Set([first.id]));
    expect(got.every((r) => r.verified)).toBe(true);
    const after = await waitFor('the delivery on the run', async () => {
      const r = await getRun(server.url, run.id);
      return r.webhook.deliveries.delivered === 1 ? r : undefined;
    });
    expect(after.webhook.deliveries).toEqual({ pending: 0, delivered: 1, failed: 0 });
    // Delivered once after the restart, and not again.
    expect(receiver.at('/held')).toHaveLength(beforeRestart + 1);
  });

  it('never returns or logs a webhook secret', async () => {
    seen.push(JSON.stringify((await api('/v1/runs?limit=1000')).body));
    seen.push(JSON.stringify((await api('/v1/batches')).body));
    seen.push(JSON.stringify((await api('/openapi.json')).body));
    const text = seen.join('\n');
    expect(text).toContain('secret_set');
    const output = [...logs, server.output()].join('\n');
    expect(output).toContain('webhook delivered');
    for (const s of secrets) {
      expect(text).not.toContain(s.slice('whsec_'.length));
      expect(output).not.toContain(s.slice('whsec_'.length));
    }
  });
});

describe('the server default webhook settings', () => {
  it('needs the URL and the secret together, holds the URL to the same rules, and never prints the secret', () => {
    const s = secret();
    expect(() => loadConfig({ REGEN_WEBHOOK_URL: 'https://hooks.example.com/regen' })).toThrow(/REGEN_WEBHOOK_URL and REGEN_WEBHOOK_SECRET: set both/);
    expect(() => loadConfig({ REGEN_WEBHOOK_SECRET: s })).toThrow(/set both, or neither/);
    expect(() => loadConfig({ REGEN_WEBHOOK_URL: 'http://169.254.169.254/', REGEN_WEBHOOK_SECRET: s })).toThrow(/REGEN_WEBHOOK_URL: link-local/);
    // A refused URL is named, not printed: its path or query often carries the receiver's token.
    expect(() => loadConfig({ REGEN_WEBHOOK_URL: 'http://169.254.169.254/hook?token=tok_x1', REGEN_WEBHOOK_SECRET: s })).toThrow(
      /^(?![\s\S]*tok_x1)[\s\S]*the value is not shown/,
    );
    const bad = 'whsec_tooshort';
    let message = '';
    try {
      loadConfig({ REGEN_WEBHOOK_URL: 'https://hooks.example.com/regen', REGEN_WEBHOOK_SECRET: bad });
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toMatch(/^REGEN_WEBHOOK_SECRET: expected "whsec_"/);
    expect(message).not.toContain('tooshort');
    expect(loadConfig({ REGEN_WEBHOOK_URL: 'https://hooks.example.com/regen', REGEN_WEBHOOK_SECRET: s })).toMatchObject({
      webhookUrl: 'https://hooks.example.com/regen',
      webhookSecret: s,
    });
  });
});
