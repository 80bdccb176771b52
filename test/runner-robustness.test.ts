import { createServer, type Server as HttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { call, startTestServer, waitFor } from './support/server.js';

// An OpenAI-compatible server that is healthy but answers every completion with a body that is
// not a chat completion: JSON `null`, then an object without choices.
function brokenServer(): Promise<{ url: string; server: HttpServer; completions: () => number }> {
  let completions = 0;
  const server = createServer((req, res) => {
    req.resume();
    const json = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.url === '/health') return json(200, {});
    if (req.url === '/v1/models') return json(200, { object: 'list', data: [{ id: 'broken-model', object: 'model' }] });
    if (req.url === '/v1/chat/completions') return json(200, completions++ % 2 === 0 ? null : { id: 'x', object: 'chat.completion' });
    return json(404, { object: 'error', message: 'not found' });
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => resolve({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, completions: () => completions })),
  );
}

describe('answers that are not chat completions', () => {
  let regen: Awaited<ReturnType<typeof startTestServer>>;
  let broken: Awaited<ReturnType<typeof brokenServer>>;

  beforeAll(async () => {
    broken = await brokenServer();
    // Two sends: a malformed answer is the server's fault, counted against its own budget.
    regen = await startTestServer({ REGEN_MAX_SERVER_FAULTS: '2' });
  });
  afterAll(async () => {
    await regen.cleanup();
    broken.server.close();
  });

  it("fail the sample once its budget for the server's faults is spent, and the process keeps serving", async () => {
    await call(regen.url, '/v1/endpoints', { method: 'POST', json: { url: broken.url } });
    const created = await call(regen.url, '/v1/runs', {
      method: 'POST',
      json: { model: 'broken-model', input: { requests: [{ custom_id: 'a', messages: [{ role: 'user', content: 'hi' }] }] }, max_attempts: 2 },
    });
    expect(created.status).toBe(201);
    const run = await waitFor('the run to end', async () => {
      const r = (await call(regen.url, `/v1/runs/${created.body.id}`)).body;
      return ['completed', 'failed'].includes(r.status) ? r : undefined;
    });
    expect(run.request_counts).toMatchObject({ total: 1, failed: 1, completed: 0 });
    const sample = (await call(regen.url, `/v1/runs/${created.body.id}/samples/a`)).body;
    expect(sample.error.code).toBe('malformed_response');
    expect(sample.attempts).toBe(2);
    expect(broken.completions()).toBe(2);
    expect((await call(regen.url, '/healthz')).status).toBe(200);
  });
});
