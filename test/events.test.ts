import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, waitFor } from './support/server.js';

const TOKEN = 'events-test-token';
const AUTH = { authorization: `Bearer ${TOKEN}` };
const MODEL = 'sim-events';
const SAMPLES = 60;
const SHARD_SIZE = 20;

let server: Awaited<ReturnType<typeof startTestServer>>;
let sim: SimProcess;

interface SseEvent {
  event: string;
  id?: string;
  data: any;
  /** When the client read it (ms since the stream opened). */
  at: number;
}

/** One block of an event stream, parsed by hand: `field: value` lines, data lines joined. */
function parseBlock(block: string, at: number): SseEvent | null {
  let event = 'message';
  let id: string | undefined;
  const data: string[] = [];
  for (const line of block.split('\n')) {
    if (line === '' || line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
    if (field === 'event') event = value;
    else if (field === 'id') id = value;
    else if (field === 'data') data.push(value);
  }
  if (!data.length) return null;
  return { event, id, data: JSON.parse(data.join('\n')), at };
}

/**
 * Reads a run's event stream with fetch until the server ends it (ended: true) or `stop` says
 * enough (then the client disconnects). Fails the test if neither happens within `ms`.
 */
async function readEvents(runId: string, opts: { lastEventId?: string; stop?: (e: SseEvent) => boolean; ms?: number } = {}) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error('event stream did not end in time')), opts.ms ?? 60_000);
  const started = performance.now();
  const res = await fetch(`${server.url}/v1/runs/${runId}/events`, {
    headers: { ...AUTH, ...(opts.lastEventId ? { 'last-event-id': opts.lastEventId } : {}) },
    signal: controller.signal,
  });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
  const events: SseEvent[] = [];
  const decoder = new TextDecoder();
  let buffer = '';
  let ended = true;
  try {
    outer: for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      buffer += decoder.decode(chunk, { stream: true });
      let cut: number;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const e = parseBlock(buffer.slice(0, cut), performance.now() - started);
        buffer = buffer.slice(cut + 2);
        if (!e) continue;
        events.push(e);
        if (opts.stop?.(e)) {
          ended = false;
          break outer;
        }
      }
    }
  } finally {
    clearTimeout(timer);
    // Leaving the loop early cancelled the body; this drops the connection for good.
    if (!ended) controller.abort();
  }
  return { events, ended, ms: performance.now() - started };
}

async function startRun(tag: string): Promise<string> {
  const requests = Array.from({ length: SAMPLES }, (_, i) => ({ custom_id: `${tag}-${i}`, messages: [{ role: 'user', content: `${tag} question ${i}` }] }));
  const res = await call(server.url, '/v1/runs', { method: 'POST', headers: AUTH, json: { model: MODEL, input: { requests }, shard_size: SHARD_SIZE } });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body.id;
}

const waitRun = (id: string) => waitForStatusAuthed(id, ['completed', 'failed', 'paused', 'cancelled']);

async function waitForStatusAuthed(id: string, statuses: string[]) {
  return waitFor(`run ${id} to become ${statuses.join('|')}`, async () => {
    const r = (await call(server.url, `/v1/runs/${id}`, { headers: AUTH })).body;
    return statuses.includes(r.status) ? r : undefined;
  });
}

async function openStreams(): Promise<number> {
  const text: string = (await call(server.url, '/metrics', { headers: AUTH })).body;
  return Number(/^regen_event_streams (\S+)$/m.exec(text)![1]);
}

beforeAll(async () => {
  // 4 at a time, ~300 ms each (50 ms to the first token, 50 tokens at 200/s): a run of 60 takes ~4.5 s.
  sim = await spawnSimulator({ model: MODEL, 'max-running': 4, 'ttft-ms': 50, 'tokens-per-second': 200, 'completion-tokens': 40, 'reasoning-tokens': 10 });
  server = await startTestServer({ REGEN_API_TOKENS: TOKEN });
  const ep = await call(server.url, '/v1/endpoints', { method: 'POST', headers: AUTH, json: { url: sim.url } });
  expect(ep.status).toBe(201);
  await waitFor('endpoint ready', async () =>
    (await call(server.url, `/v1/endpoints/${ep.body.id}`, { headers: AUTH })).body.state === 'ready' ? true : undefined,
  );
});

afterAll(async () => {
  await server?.cleanup();
  await sim?.stop();
});

describe('GET /v1/runs/{id}/events', () => {
  it('streams progress about once a second, every status change and shard upload, and ends at completion', async () => {
    const runId = await startRun('live');
    const { events, ended, ms } = await readEvents(runId);
    expect(ended).toBe(true);

    const statuses = events.filter((e) => e.event === 'status');
    expect(statuses.map((e) => e.data.status)).toEqual(['validating', 'queued', 'in_progress', 'finalizing', 'completed']);
    expect(events.at(-1)).toMatchObject({ event: 'status', data: { run_id: runId, status: 'completed', reason: null } });

    const shards = events.filter((e) => e.event === 'shard_uploaded');
    expect(shards.map((e) => e.data.shard).sort()).toEqual([0, 1, 2]);
    for (const s of shards) expect(s.data).toMatchObject({ run_id: runId, lines: SHARD_SIZE, errors: 0, key: `shard-0000${s.data.shard}.jsonl` });

    // Status and shard events carry the events table's ids, rising; progress events carry none.
    const ids = events.filter((e) => e.event !== 'progress').map((e) => Number(e.id));
    expect(ids.every((id) => Number.isInteger(id) && id > 0)).toBe(true);
    expect([...ids].sort((a, b) => a - b)).toEqual(ids);
    const progress = events.filter((e) => e.event === 'progress');
    expect(progress.every((e) => e.id === undefined)).toBe(true);

    // About one a second: the run took a few seconds, so a few of them, never bunched up (the
    // last one is sent with the end, whenever it comes).
    expect(ms).toBeGreaterThan(2000);
    expect(progress.length).toBeGreaterThanOrEqual(3);
    expect(progress.length).toBeLessThanOrEqual(Math.ceil(ms / 1000) + 2);
    const gaps = progress.slice(1, -1).map((e, i) => e.at - progress[i].at);
    for (const gap of gaps) expect(gap).toBeGreaterThan(700);

    // Each carries the run's counts, which only ever grow, and the last one is the finished run.
    const completed = progress.map((e) => e.data.request_counts.completed);
    expect([...completed].sort((a, b) => a - b)).toEqual(completed);
    const last = progress.at(-1)!.data;
    const run = (await call(server.url, `/v1/runs/${runId}`, { headers: AUTH })).body;
    expect(last).toEqual({
      id: runId,
      status: 'completed',
      status_reason: null,
      request_counts: run.request_counts,
      turns: null,
      quality: run.quality,
      usage: run.usage,
      shards: { total: 3, uploaded: 3 },
      progress: {
        ...run.progress,
        samples_per_second: last.progress.samples_per_second,
        completion_tokens_per_second: last.progress.completion_tokens_per_second,
      },
      forecast: run.forecast,
    });
    expect(last.request_counts).toMatchObject({ total: SAMPLES, completed: SAMPLES });
    expect(progress.some((e) => e.data.status === 'in_progress' && e.data.request_counts.completed > 0 && e.data.request_counts.completed < SAMPLES)).toBe(
      true,
    );
  });

  it('replays what a client missed when it reconnects with Last-Event-ID, and stops its timers when the client goes away', async () => {
    const runId = await startRun('resume');
    const first = await readEvents(runId, { stop: (e) => e.event === 'status' && e.data.status === 'in_progress' });
    expect(first.ended).toBe(false);
    const seen = first.events.filter((e) => e.id !== undefined);
    const lastId = seen.at(-1)!.id!;
    expect(seen.map((e) => e.data.status)).toEqual(['validating', 'queued', 'in_progress']);

    // Paused, the run cannot end the stream by finishing: only the disconnect can, and must.
    expect((await call(server.url, `/v1/runs/${runId}/pause`, { method: 'POST', headers: AUTH })).status).toBe(200);
    await waitFor('the event stream to close', async () => ((await openStreams()) === 0 ? true : undefined), 10_000);
    expect((await call(server.url, `/v1/runs/${runId}/resume`, { method: 'POST', headers: AUTH, json: {} })).status).toBe(200);

    const done = await waitRun(runId);
    expect(done.status).toBe('completed');

    const again = await readEvents(runId, { lastEventId: lastId });
    expect(again.ended).toBe(true);
    const missed = again.events.filter((e) => e.event !== 'progress');
    expect(missed.every((e) => Number(e.id) > Number(lastId))).toBe(true);
    expect(missed.filter((e) => e.event === 'status').map((e) => e.data.status)).toEqual(['paused', 'queued', 'in_progress', 'finalizing', 'completed']);
    expect(missed.filter((e) => e.event === 'shard_uploaded')).toHaveLength(3);

    // Exactly what a full replay holds after that id, nothing more, nothing less.
    const full = await readEvents(runId);
    const after = full.events.filter((e) => e.event !== 'progress' && Number(e.id) > Number(lastId));
    expect(missed.map((e) => [e.id, e.event, e.data])).toEqual(after.map((e) => [e.id, e.event, e.data]));
    expect(full.events.filter((e) => e.event === 'status').map((e) => e.data.status)).toEqual([
      'validating',
      'queued',
      'in_progress',
      'paused',
      'queued',
      'in_progress',
      'finalizing',
      'completed',
    ]);
    expect(await openStreams()).toBe(0);
  });

  it('needs the token, names an unknown run, and refuses a malformed Last-Event-ID', async () => {
    const runId = (await call(server.url, '/v1/runs?limit=1', { headers: AUTH })).body.data[0].id;
    const anonymous = await call(server.url, `/v1/runs/${runId}/events`);
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get('content-type')).toBe('application/problem+json');

    const missing = await call(server.url, '/v1/runs/run_nope/events', { headers: AUTH });
    expect(missing.status).toBe(404);
    expect(missing.body.detail).toContain('run_nope');

    const bad = await call(server.url, `/v1/runs/${runId}/events`, { headers: { ...AUTH, 'last-event-id': 'abc' } });
    expect(bad.status).toBe(422);
    expect(bad.body.field).toBe('last-event-id');
  });
});
