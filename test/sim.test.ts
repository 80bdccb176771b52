import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startSimulator } from '../src/sim/server.js';
import { nodeEntry } from './support/build.js';

// The simulator's CLI as this run compiled it (test/support/build.ts).
const SIM = nodeEntry('src/sim/main.ts');
const ROOT = fileURLToPath(new URL('..', import.meta.url));

interface SimProcess {
  url: string;
  pid: number;
  child: ChildProcess;
  exited: Promise<number | null>;
}

const started: SimProcess[] = [];

function spawnCli(args: string[]): { child: ChildProcess; exited: Promise<number | null>; stderr: () => string } {
  const child = spawn(process.execPath, [...SIM, ...args], { cwd: ROOT, stdio: 'pipe' });
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = once(child, 'exit').then(([code]) => code as number | null);
  return { child, exited, stderr: () => stderr };
}

/** Starts `regen sim` as its own process on a free loopback port and waits for its listening line. */
async function spawnSim(...args: string[]): Promise<SimProcess> {
  const { child, exited, stderr } = spawnCli(['--port', '0', ...args]);
  const lines = createInterface({ input: child.stdout! });
  const first = await Promise.race([
    once(lines, 'line').then(([line]) => line as string),
    exited.then((code) => {
      throw new Error(`simulator exited with ${code} before listening: ${stderr()}`);
    }),
  ]);
  const event = JSON.parse(first) as { event: string; url: string; port: number; pid: number };
  expect(event).toEqual({ event: 'listening', url: `http://127.0.0.1:${event.port}`, port: event.port, pid: child.pid });
  const sim = { url: event.url, pid: event.pid, child, exited };
  started.push(sim);
  return sim;
}

afterAll(async () => {
  await Promise.all(
    started.map(async ({ child, exited }) => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const timeout = setTimeout(() => child.kill('SIGKILL'), 3000);
      await exited;
      clearTimeout(timeout);
    }),
  );
});

const digest = (messages: unknown[]): string => createHash('sha256').update(JSON.stringify(messages)).digest('hex').slice(0, 16);

const user = (content: string) => [{ role: 'user', content }];

function chat(url: string, body: object, signal?: AbortSignal): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal,
  });
}

async function stats(url: string): Promise<Record<string, number>> {
  return (await fetch(`${url}/sim/stats`)).json() as Promise<Record<string, number>>;
}

async function configure(url: string, patch: object): Promise<Response> {
  return fetch(`${url}/sim/config`, { method: 'POST', body: JSON.stringify(patch) });
}

async function waitFor<T>(probe: () => Promise<T>, ok: (value: T) => boolean, timeoutMs = 5000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (ok(value) || Date.now() > deadline) return value;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const LABELS = 'engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"';

function metric(text: string, name: string): number {
  const match = new RegExp(`^sglang:${name}\\{model_name="[^"]*",${LABELS}\\} (\\S+)$`, 'm').exec(text);
  if (!match) throw new Error(`metric ${name} missing from:\n${text}`);
  return Number(match[1]);
}

interface SimMessage {
  content: string;
  reasoning_content: string | null;
}

const messageOf = (completion: OpenAI.Chat.ChatCompletion): SimMessage => completion.choices[0].message as unknown as SimMessage;

describe('regen sim: responses', { timeout: 20_000 }, () => {
  let url: string;
  let client: OpenAI;

  beforeAll(async () => {
    ({ url } = await spawnSim(
      '--model',
      'test-model',
      '--context-length',
      '200',
      '--completion-tokens',
      '40',
      '--reasoning-tokens',
      '20',
      '--enable-cache-report',
      '1',
    ));
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
  }, 20_000);

  it('lists its model and server info like SGLang', async () => {
    const models = await client.models.list();
    expect(models.data).toEqual([
      { id: 'test-model', object: 'model', created: expect.any(Number), owned_by: 'sglang', root: 'test-model', max_model_len: 200 },
    ]);
    const info = await (await fetch(`${url}/server_info`)).json();
    expect(info).toMatchObject({
      model_path: 'test-model',
      served_model_name: 'test-model',
      context_length: 200,
      max_running_requests: null,
      max_total_num_tokens: 64 * 200,
      startup_time: expect.any(Number),
      version: '0.5.17',
      internal_states: [
        {
          last_gen_throughput: expect.any(Number),
          memory_usage: { weight: 0, kvcache: 0, token_capacity: 64 * 200, graph: 0 },
          effective_max_running_requests_per_dp: 64,
        },
      ],
    });
    expect(await (await fetch(`${url}/get_server_info`)).json()).toEqual({ ...info, internal_states: expect.any(Array) });
    expect((await fetch(`${url}/health`)).status).toBe(200);
    expect((await fetch(`${url}/health_generate`)).status).toBe(200);
  });

  it('answers the openai client with reasoning_content and SGLang usage', async () => {
    const messages = [
      { role: 'system' as const, content: 'You are terse.' },
      { role: 'user' as const, content: 'What is two plus two?' },
    ];
    const { data, response } = await client.chat.completions.create({ model: 'test-model', messages, temperature: 0.6, seed: 7 }).withResponse();
    const d = digest(messages);
    expect(response.headers.get('x-sim-digest')).toBe(d);
    expect(data.id).toMatch(/^[0-9a-f]{32}$/);
    expect(data).toMatchObject({ object: 'chat.completion', model: 'test-model' });
    expect(Math.abs(data.created - Date.now() / 1000)).toBeLessThan(60);
    expect(data.choices).toEqual([
      {
        index: 0,
        message: { role: 'assistant', content: expect.any(String), reasoning_content: expect.any(String), tool_calls: null },
        logprobs: null,
        finish_reason: 'stop',
        matched_stop: 151645,
      },
    ]);
    const message = messageOf(data);
    expect(message.content.startsWith(`Answer ${d}: `)).toBe(true);
    expect(message.content).toHaveLength(40 * 4);
    expect(message.reasoning_content!.startsWith(`Reasoning about ${d}. `)).toBe(true);
    expect(message.reasoning_content).toHaveLength(20 * 4);
    const promptTokens = Math.ceil(('You are terse.'.length + 'What is two plus two?'.length) / 4) + 2 * 4;
    expect(data.usage).toEqual({
      prompt_tokens: promptTokens,
      completion_tokens: 60,
      total_tokens: promptTokens + 60,
      reasoning_tokens: 20,
      prompt_tokens_details: null,
    });
    expect((data as unknown as { metadata: object }).metadata).toEqual({ weight_version: 'default' });
  });

  it('gives each output token its log probability and top alternatives when asked', async () => {
    const body = await (await chat(url, { model: 'test-model', messages: user('probabilities'), logprobs: true, top_logprobs: 3 })).json();
    const { content } = body.choices[0].logprobs;
    const message = body.choices[0].message;
    expect(content).toHaveLength(body.usage.completion_tokens);
    expect(content.map((t: { token: string }) => t.token).join('')).toBe(message.reasoning_content + message.content);
    for (const t of content) {
      expect(t.logprob).toBeLessThanOrEqual(0);
      expect(t.bytes).toEqual([...Buffer.from(t.token)]);
      expect(t.top_logprobs).toHaveLength(3);
      expect(t.top_logprobs[0]).toEqual({ token: t.token, logprob: t.logprob, bytes: t.bytes });
    }
    expect((await chat(url, { messages: user('probabilities'), top_logprobs: 21 })).status).toBe(400);
  });

  it('is deterministic per prompt and reports cached tokens on a repeat', async () => {
    const messages = user('repeat me');
    const first = await (await chat(url, { model: 'test-model', messages })).json();
    const second = await (await chat(url, { model: 'default', messages })).json();
    const other = await (await chat(url, { messages: user('something else') })).json();
    expect(second.choices[0].message).toEqual(first.choices[0].message);
    expect(second.id).not.toBe(first.id);
    expect(other.choices[0].message.content).not.toBe(first.choices[0].message.content);
    // Earlier prompts share only the template's opening (`<|im_start|>user\n`) with this one.
    expect(first.usage.prompt_tokens_details?.cached_tokens ?? 0).toBeLessThanOrEqual(3);
    expect(second.usage.prompt_tokens_details).toEqual({ cached_tokens: first.usage.prompt_tokens - 1 });
    // SGLang never checks `model`: whatever was sent comes back.
    expect(first.model).toBe('test-model');
    expect(second.model).toBe('default');
    expect(other.model).toBe('test-model');
  });

  it('writes reasoning that does not look like a degenerate loop', async () => {
    const text: string = (await (await chat(url, { messages: user('loop?') })).json()).choices[0].message.reasoning_content;
    const words = text
      .split(/[\s.]+/)
      .filter(Boolean)
      .slice(4);
    expect(new Set(words).size).toBeGreaterThan(words.length / 2);
    expect(text.slice(-20)).not.toBe(text.slice(-40, -20));
  });

  it('gives reasoning_content null when thinking is off', async () => {
    const body = await (await chat(url, { messages: user('no thinking'), chat_template_kwargs: { enable_thinking: false } })).json();
    expect(body.choices[0].message.reasoning_content).toBeNull();
    expect(body.usage.reasoning_tokens).toBe(0);
    expect(body.usage.completion_tokens).toBe(40);
  });

  it('cuts thinking at max_tokens: finish_reason length, content "" and all text in reasoning_content', async () => {
    const messages = user('long thought');
    const full = await (await chat(url, { messages })).json();
    const cut = await (await chat(url, { messages, max_tokens: 5 })).json();
    expect(cut.choices[0].finish_reason).toBe('length');
    expect(cut.choices[0].matched_stop).toBeNull();
    expect(cut.choices[0].message.content).toBe('');
    expect(cut.choices[0].message.reasoning_content).toBe(full.choices[0].message.reasoning_content.slice(0, 20));
    expect(cut.usage).toMatchObject({ completion_tokens: 5, reasoning_tokens: 5 });
  });

  it('cuts the answer when reasoning fits but the answer does not', async () => {
    const messages = user('long answer');
    const full = await (await chat(url, { messages })).json();
    const cut = await (await chat(url, { messages, max_tokens: 30 })).json();
    expect(cut.choices[0].finish_reason).toBe('length');
    expect(cut.choices[0].message.reasoning_content).toBe(full.choices[0].message.reasoning_content);
    expect(cut.choices[0].message.content).toBe(full.choices[0].message.content.slice(0, 10 * 4));
    expect(cut.usage).toMatchObject({ completion_tokens: 30, reasoning_tokens: 20 });
    const exact = await (await chat(url, { messages, max_tokens: 60 })).json();
    expect(exact.choices[0].finish_reason).toBe('stop');
  });

  it('rejects a prompt longer than the context with SGLang message and error body', async () => {
    const response = await chat(url, { messages: user('x'.repeat(1000)) });
    expect(response.status).toBe(400);
    expect(await response.json()).toEqual({
      object: 'error',
      message: "The input (254 tokens) is longer than the model's context length (200 tokens).",
      type: 'BadRequestError',
      param: null,
      code: 400,
    });
    // The SDK reads the message from `{"error": {...}}` only, so SGLang's top-level body reaches it as
    // "400 status code (no body)": whoever needs the message must read the body itself.
    const sdkError = await client.chat.completions.create({ model: 'test-model', messages: user('y'.repeat(1000)) as never }).catch((error: unknown) => error);
    expect(sdkError).toBeInstanceOf(OpenAI.BadRequestError);
    expect((sdkError as InstanceType<typeof OpenAI.BadRequestError>).status).toBe(400);
  });

  it('rejects prompt + max_tokens at or over the context with SGLang message', async () => {
    const messages = user('x'.repeat(400));
    const response = await chat(url, { messages, max_tokens: 96 });
    expect(response.status).toBe(400);
    expect(await response.json()).toEqual({
      object: 'error',
      message:
        "Requested token count exceeds the model's maximum context length of 200 tokens. You requested a total of 200 " +
        'tokens: 104 tokens from the input messages and 96 tokens for the completion. Please reduce the number of tokens ' +
        'in the input messages or the completion to fit within the limit.',
      type: 'BadRequestError',
      param: null,
      code: 400,
    });
    expect((await chat(url, { messages, max_tokens: 95 })).status).toBe(200);
    // Without max_tokens SGLang caps the generation at what is left of the context.
    const capped = await (await chat(url, { messages: user('y'.repeat(600)) })).json();
    expect(capped.usage).toMatchObject({ prompt_tokens: 154, completion_tokens: 46 });
    expect(capped.choices[0].finish_reason).toBe('length');
  });

  it('streams the same answer as SGLang does: a token an event, the finish, the usage chunk with empty choices, [DONE]', async () => {
    const whole = await (await chat(url, { messages: user('stream me') })).json();
    const res = await chat(url, { messages: user('stream me'), stream: true, stream_options: { include_usage: true } });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    const events = (await res.text()).split('\n\n').filter(Boolean);
    expect(events.at(-1)).toBe('data: [DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice('data: '.length)));
    expect(chunks[0].choices[0].delta).toMatchObject({ role: 'assistant', content: '' });
    const text = (field: string) => chunks.map((c) => c.choices[0]?.delta[field] ?? '').join('');
    expect(text('content')).toBe(whole.choices[0].message.content);
    expect(text('reasoning_content')).toBe(whole.choices[0].message.reasoning_content);
    expect(chunks.at(-2).choices[0].finish_reason).toBe(whole.choices[0].finish_reason);
    expect(chunks.at(-1).choices).toEqual([]);
    // The second asking of the prompt may hit the prefix cache: only the token counts must agree.
    const { prompt_tokens, completion_tokens, reasoning_tokens } = whole.usage;
    expect(chunks.at(-1).usage).toMatchObject({ prompt_tokens, completion_tokens, reasoning_tokens });
    // One event a token that has text, between the role chunk and the finish.
    expect(chunks.length - 3).toBe(whole.usage.completion_tokens);
  });

  it('rejects a missing messages array, accepts any model, and 404s a wrong URL like FastAPI', async () => {
    for (const body of [{}, { messages: [] }, { messages: 'hi' }, { messages: ['hi'] }]) {
      const response = await chat(url, body);
      expect(response.status).toBe(400);
      expect(await response.json()).toMatchObject({ object: 'error', type: 'Bad Request', code: 400 });
    }
    const badJson = await fetch(`${url}/v1/chat/completions`, { method: 'POST', body: '{"messages": [' });
    expect(badJson.status).toBe(400);
    const other = await chat(url, { model: '/models/Other-7B', messages: user('hi') });
    expect(other.status).toBe(200);
    expect((await other.json()).model).toBe('/models/Other-7B');
    const wrongUrl = await fetch(`${url}/v1/chat/complete`, { method: 'POST', body: '{}' });
    expect(wrongUrl.status).toBe(404);
    expect(await wrongUrl.json()).toEqual({ detail: 'Not Found' });
    const wrongMethod = await fetch(`${url}/v1/chat/completions`);
    expect(wrongMethod.status).toBe(405);
    expect(await wrongMethod.json()).toEqual({ detail: 'Method Not Allowed' });
  });

  it('exposes SGLang metrics that count generated tokens', async () => {
    const before = await (await fetch(`${url}/metrics`)).text();
    expect(before).toContain('# TYPE sglang:num_running_reqs gauge');
    expect(before).toContain('# HELP sglang:num_queue_reqs');
    expect(before).toContain('# TYPE sglang:generation_tokens_total counter');
    expect(metric(before, 'num_running_reqs')).toBe(0);
    expect(metric(before, 'num_queue_reqs')).toBe(0);
    const reply = await (await chat(url, { messages: user('count my tokens') })).json();
    const after = await (await fetch(`${url}/metrics`)).text();
    expect(metric(after, 'generation_tokens_total') - metric(before, 'generation_tokens_total')).toBe(reply.usage.completion_tokens);
    expect(after).toContain(`sglang:num_running_reqs{model_name="test-model",${LABELS}} 0`);
    for (const name of ['token_usage', 'gen_throughput', 'cache_hit_rate', 'num_retracted_reqs']) {
      expect(after).toContain(`# TYPE sglang:${name} gauge`);
      expect(metric(after, name)).toBeGreaterThanOrEqual(0);
    }
    expect(after).toContain('# TYPE sglang:num_retracted_requests_total counter');
  });

  it('refuses a bad runtime config and an unknown route', async () => {
    const bad = await configure(url, { maxRunning: 0 });
    expect(bad.status).toBe(400);
    expect((await bad.json()).message).toMatch(/maxRunning must be a positive integer/);
    expect((await configure(url, { port: 1 })).status).toBe(400);
    expect((await configure(url, { nope: 1 })).status).toBe(400);
    expect((await fetch(`${url}/nowhere`)).status).toBe(404);
  });
});

describe('regen sim: startup and latency', { timeout: 20_000 }, () => {
  it('answers 503 on every route while starting, then 200', async () => {
    const { url } = await spawnSim('--startup-ms', '1500', '--ttft-ms', '100', '--tokens-per-second', '400');
    const startedAt = Date.now();
    expect((await fetch(`${url}/health`)).status).toBe(503);
    expect((await fetch(`${url}/health_generate`)).status).toBe(503);
    expect((await fetch(`${url}/v1/models`)).status).toBe(503);
    expect((await fetch(`${url}/server_info`)).status).toBe(503);
    expect((await fetch(`${url}/v1/loads`)).status).toBe(503);
    const early = await chat(url, { messages: user('too early') });
    expect(early.status).toBe(503);
    expect(await early.json()).toMatchObject({ object: 'error', type: 'ServiceUnavailableError', code: 503 });

    const health = await waitFor(
      () => fetch(`${url}/health`).then((r) => r.status),
      (s) => s === 200,
      5000,
    );
    expect(health).toBe(200);
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(1000);

    // 100 ms to the first token, then 96 tokens (64 answer + 32 reasoning by default) at 400 tokens/s: 240 ms.
    const sentAt = Date.now();
    const response = await chat(url, { messages: user('timed') });
    expect(response.status).toBe(200);
    expect((await response.json()).usage.completion_tokens).toBe(96);
    expect(Date.now() - sentAt).toBeGreaterThanOrEqual(330);
  });
});

describe('regen sim: admission', { timeout: 20_000 }, () => {
  let url: string;

  beforeAll(async () => {
    ({ url } = await spawnSim('--max-running', '2', '--max-queue', '2', '--ttft-ms', '600'));
  }, 20_000);

  it('runs at most max-running requests, queues the next ones and turns away the rest', async () => {
    const admitted = [1, 2, 3, 4].map((i) => chat(url, { messages: user(`request ${i}`) }));
    const busy = await waitFor(
      () => stats(url),
      (s) => s.running === 2 && s.queued === 2,
    );
    expect(busy).toMatchObject({ running: 2, queued: 2 });
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metric(metrics, 'num_running_reqs')).toBe(2);
    expect(metric(metrics, 'num_queue_reqs')).toBe(2);

    const turnedAway = await chat(url, { messages: user('one too many') });
    expect(turnedAway.status).toBe(503);
    expect(await turnedAway.json()).toEqual({
      object: 'error',
      message: 'The request queue is full.',
      type: 'ServiceUnavailableError',
      param: null,
      code: 503,
    });

    const responses = await Promise.all(admitted);
    expect(responses.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    expect(await stats(url)).toMatchObject({ completed: 4, rejected: 1, running: 0, queued: 0, maxRunningSeen: 2 });
  });

  it('frees the place of a client that gives up, queued or running', async () => {
    const before = await stats(url);
    const running = new AbortController();
    const queued = new AbortController();
    const first = chat(url, { messages: user('a') }, running.signal).catch((error: Error) => error);
    const second = chat(url, { messages: user('b') }, AbortSignal.timeout(5000));
    const third = chat(url, { messages: user('c') }, queued.signal).catch((error: Error) => error);
    await waitFor(
      () => stats(url),
      (s) => s.running === 2 && s.queued === 1,
    );

    queued.abort();
    expect(await third).toBeInstanceOf(Error);
    expect(
      await waitFor(
        () => stats(url),
        (s) => s.queued === 0,
      ),
    ).toMatchObject({ queued: 0, running: 2 });

    running.abort();
    expect(await first).toBeInstanceOf(Error);
    expect(
      await waitFor(
        () => stats(url),
        (s) => s.running === 1,
      ),
    ).toMatchObject({ running: 1 });
    expect((await second).status).toBe(200);
    const after = await stats(url);
    expect(after.aborted - before.aborted).toBe(2);
    expect(after.completed - before.completed).toBe(1);
  });

  it('takes queued requests at once when max running is raised at runtime', async () => {
    const pending = [1, 2, 3, 4].map((i) => chat(url, { messages: user(`raise ${i}`) }));
    await waitFor(
      () => stats(url),
      (s) => s.running === 2 && s.queued === 2,
    );
    expect((await configure(url, { maxRunning: 4 })).status).toBe(200);
    expect(await stats(url)).toMatchObject({ running: 4, queued: 0, maxRunningSeen: 4 });
    expect((await Promise.all(pending)).map((r) => r.status)).toEqual([200, 200, 200, 200]);
  });
});

describe('regen sim: faults', { timeout: 20_000 }, () => {
  let url: string;
  let client: OpenAI;

  beforeAll(async () => {
    ({ url } = await spawnSim('--degenerate-rate', '1', '--seed', '42'));
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
  }, 20_000);

  it('replies with an empty think block and "OK." at degenerate rate 1', async () => {
    const body = await (await chat(url, { messages: user('degenerate') })).json();
    expect(body.choices[0].message).toMatchObject({ content: 'OK.', reasoning_content: null });
    expect(body.choices[0].finish_reason).toBe('stop');
    expect(body.usage).toMatchObject({ completion_tokens: 2, reasoning_tokens: 0 });
  });

  it('flips degenerate replies at runtime and mixes them at rate 0.5', async () => {
    expect((await configure(url, { degenerateRate: 0 })).status).toBe(200);
    const healthy = await (await chat(url, { messages: user('healthy') })).json();
    expect(healthy.choices[0].message.content).not.toBe('OK.');

    await configure(url, { degenerateRate: 0.5 });
    const replies = await Promise.all(Array.from({ length: 200 }, (_, i) => chat(url, { messages: user(`mixed ${i}`) }).then((r) => r.json())));
    const degenerate = replies.filter((r) => r.choices[0].message.content === 'OK.').length;
    expect(degenerate).toBeGreaterThan(60);
    expect(degenerate).toBeLessThan(140);
    await configure(url, { degenerateRate: 0 });
  });

  it('answers 500 and 503 with SGLang error bodies at error rate 1', async () => {
    await configure(url, { errorRate: 1 });
    const responses = await Promise.all(Array.from({ length: 30 }, () => chat(url, { messages: user('fail') })));
    const statuses = new Set(responses.map((r) => r.status));
    expect(statuses).toEqual(new Set([500, 503]));
    const body = await responses.find((r) => r.status === 500)!.json();
    expect(body).toEqual({ object: 'error', message: 'Internal server error', type: 'InternalServerError', param: null, code: 500 });
    const unavailable = await responses.find((r) => r.status === 503)!.json();
    expect(unavailable).toMatchObject({ type: 'ServiceUnavailableError', code: 503 });
    await expect(client.chat.completions.create({ model: 'sim-model', messages: user('sdk') as never })).rejects.toBeInstanceOf(OpenAI.APIError);
    await configure(url, { errorRate: 0 });
    expect((await chat(url, { messages: user('recovered') })).status).toBe(200);
  });

  it('drops the connection at reset rate 1', async () => {
    const before = await stats(url);
    await configure(url, { resetRate: 1 });
    await expect(chat(url, { messages: user('reset') })).rejects.toThrow();
    await expect(client.chat.completions.create({ model: 'sim-model', messages: user('sdk') as never })).rejects.toBeInstanceOf(OpenAI.APIConnectionError);
    await configure(url, { resetRate: 0 });
    expect((await stats(url)).resets - before.resets).toBe(2);
  });

  it('never answers at hang rate 1 and frees the slot when the client gives up', async () => {
    await configure(url, { hangRate: 1 });
    const startedAt = Date.now();
    await expect(chat(url, { messages: user('hang') }, AbortSignal.timeout(300))).rejects.toThrow();
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(290);
    await configure(url, { hangRate: 0 });
    const after = await waitFor(
      () => stats(url),
      (s) => s.running === 0,
    );
    expect(after).toMatchObject({ running: 0, hangs: 1, aborted: 1 });
  });
});

describe('regen sim: process lifecycle', { timeout: 20_000 }, () => {
  it('exits with code 1 when the die-after-th chat request arrives', async () => {
    const sim = await spawnSim('--die-after', '3');
    expect((await chat(sim.url, { messages: user('one') })).status).toBe(200);
    expect((await chat(sim.url, { messages: user('two') })).status).toBe(200);
    await expect(chat(sim.url, { messages: user('three') })).rejects.toThrow();
    expect(await sim.exited).toBe(1);
    await expect(fetch(`${sim.url}/health`)).rejects.toThrow();
  });

  it('drains on SIGTERM: /health 503, running requests finish, then it exits', async () => {
    const sim = await spawnSim('--ttft-ms', '800');
    const running = chat(sim.url, { messages: user('finish me') });
    await waitFor(
      () => stats(sim.url),
      (s) => s.running === 1,
    );
    sim.child.kill('SIGTERM');
    await waitFor(
      () => fetch(`${sim.url}/health`).then((r) => r.status),
      (status) => status === 503,
    );
    expect((await fetch(`${sim.url}/health`)).status).toBe(503);
    expect(sim.child.exitCode).toBeNull();
    expect((await running).status).toBe(200);
    expect(await sim.exited).toBe(0);
  });

  it('waits on a hung request while draining, and a second SIGTERM closes at once', async () => {
    const sim = await spawnSim('--hang-rate', '1');
    const hung = chat(sim.url, { messages: user('stuck') }).catch((error: Error) => error);
    await waitFor(
      () => stats(sim.url),
      (s) => s.hangs === 1,
    );
    sim.child.kill('SIGTERM');
    await waitFor(
      () => fetch(`${sim.url}/health`).then((r) => r.status),
      (status) => status === 503,
    );
    expect(sim.child.exitCode).toBeNull();
    const signalledAt = Date.now();
    sim.child.kill('SIGTERM');
    expect(await sim.exited).toBe(0);
    expect(Date.now() - signalledAt).toBeLessThan(5000);
    expect(await hung).toBeInstanceOf(Error);
  });

  it.each([
    [['--max-running', 'abc'], /^regen sim: --max-running must be a positive integer \(got "abc"\)\n$/],
    [['--error-rate', '1.5'], /^regen sim: --error-rate must be a number from 0 to 1/],
    [['--port', ''], /^regen sim: --port must be an integer from 0 to 65535/],
    [['--bogus', '1'], /^regen sim: Unknown option '--bogus'/],
  ])('exits with code 2 and one line on stderr for %j', async (args, message) => {
    const { exited, stderr, child } = spawnCli(args);
    let stdout = '';
    child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    expect(await exited).toBe(2);
    expect(stderr()).toMatch(message);
    expect(stderr().trim().split('\n')).toHaveLength(1);
    expect(stdout).toBe('');
  });
});

describe('startSimulator in process', () => {
  it('serves keep-alive traffic at zero latency and closes with hung sockets open', async () => {
    const sim = await startSimulator({ maxRunning: 4, hangRate: 0 });
    try {
      expect(sim.url).toBe(`http://127.0.0.1:${sim.port}`);
      const responses = await Promise.all(Array.from({ length: 500 }, (_, i) => chat(sim.url, { messages: user(`fast ${i}`) })));
      expect(responses.every((r) => r.status === 200)).toBe(true);
      await Promise.all(responses.map((r) => r.arrayBuffer()));
      expect(sim.stats()).toMatchObject({ requests: 500, completed: 500, running: 0, queued: 0 });
      expect(() => sim.configure({ errorRate: 2 })).toThrow(/errorRate must be a number from 0 to 1/);
      sim.configure({ hangRate: 1 });
      const hung = chat(sim.url, { messages: user('hang') }).catch((error: Error) => error);
      await waitFor(
        async () => sim.stats(),
        (s) => s.hangs === 1,
      );
      expect(sim.stats().running).toBe(1);
      await sim.close();
      expect(await hung).toBeInstanceOf(Error);
    } finally {
      await sim.close();
    }
  });

  it('holds chat requests past holdAfter, counted, until it is raised or set to 0', async () => {
    const sim = await startSimulator({ holdAfter: 1 });
    try {
      expect((await chat(sim.url, { messages: user('first') })).status).toBe(200);
      let answered = 0;
      const held = [0, 1, 2].map(async (i) => {
        const r = await chat(sim.url, { messages: user(`held ${i}`) });
        answered++;
        return r;
      });
      await waitFor(
        () => stats(sim.url),
        (s) => s.requests === 4,
      );
      expect(answered).toBe(0);
      expect((await configure(sim.url, { holdAfter: 3 })).status).toBe(200);
      await waitFor(
        async () => answered,
        (n) => n === 2,
      );
      // The one that arrived fourth is still held.
      await new Promise((r) => setTimeout(r, 100));
      expect(answered).toBe(2);
      expect((await configure(sim.url, { holdAfter: 0 })).status).toBe(200);
      for (const r of await Promise.all(held)) expect(r.status).toBe(200);
      expect((await stats(sim.url)).completed).toBe(4);
    } finally {
      await sim.close();
    }
  });

  it('calls onDie instead of answering the die-after-th request', async () => {
    let died = 0;
    const sim = await startSimulator({ dieAfter: 2, onDie: () => died++ });
    try {
      expect((await chat(sim.url, { messages: user('first') })).status).toBe(200);
      const second = chat(sim.url, { messages: user('second') }, AbortSignal.timeout(500));
      await expect(second).rejects.toThrow();
      expect(died).toBe(1);
    } finally {
      await sim.close();
    }
  });
});
