import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hostname } from 'node:os';
import { loadConfig } from '../src/config.js';
import { eventsAfter } from '../src/db/events.js';
import { makeLogger } from '../src/logger.js';
import { CAP_SOURCES } from '../src/domain/concurrency.js';
import { FLAGS } from '../src/domain/flags.js';
import { serverCeiling } from '../src/runner/capacity.js';
import { startServer, type Server } from '../src/server.js';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { call, startTestServer, tempDir, waitFor } from './support/server.js';
import { onPg, storeEnv } from './support/store.js';

const TOKEN = 'metrics-test-token';
const ENDPOINT_KEY = 'sk-endpoint-secret-41';
const AUTH = { authorization: `Bearer ${TOKEN}` };
const MODEL = 'sim-metrics';
const SAMPLES = 120;
const SHARD_SIZE = 40;
const MAX_RUNNING = 8;
/** Flags judged against the run's answers so far rather than the answer alone. */
const RUN_RELATIVE = new Set<string>(['duplicate_content', 'short_for_run']);

interface Series {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The Prometheus text format, read by hand: `name{a="b",...} value` lines, comments kept apart. */
function parseMetrics(text: string) {
  const series: Series[] = [];
  const types = new Map<string, string>();
  for (const line of text.split('\n')) {
    const type = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (type) types.set(type[1], type[2]);
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`not a metrics line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    series.push({ name: m[1], labels, value: Number(m[3]) });
  }
  /** The sum over the series of `name` whose labels include `where`. */
  const value = (name: string, where: Record<string, string> = {}) => {
    const hits = series.filter((s) => s.name === name && Object.entries(where).every(([k, v]) => s.labels[k] === v));
    if (!hits.length) throw new Error(`no series ${name} ${JSON.stringify(where)}`);
    return hits.reduce((t, s) => t + s.value, 0);
  };
  return { series, types, value };
}

async function scrape(base: string) {
  const res = await fetch(`${base}/metrics`, { headers: AUTH });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type')).toMatch(/^text\/plain/);
  const text = await res.text();
  return { text, ...parseMetrics(text) };
}

const tmp = tempDir();
const logLines: string[] = [];
let server: Server;
let sim: SimProcess;
let endpointId: string;
let runId: string;
let run: any;
let midRun: ReturnType<typeof parseMetrics>;

beforeAll(async () => {
  sim = await spawnSimulator({
    model: MODEL,
    'max-running': MAX_RUNNING,
    'ttft-ms': 100,
    'tokens-per-second': 500,
    'completion-tokens': 40,
    'reasoning-tokens': 10,
    'degenerate-rate': 0.25,
    'error-rate': 0.1,
    seed: 7,
  });
  const config = loadConfig(
    { ...(await storeEnv(tmp.dir)), REGEN_API_TOKENS: TOKEN, REGEN_PROBE_INTERVAL_MS: '200', REGEN_LOG_LEVEL: 'debug' },
    { data: tmp.dir, port: '0' },
  );
  server = await startServer(config, { logger: makeLogger('debug', { write: (line: string) => void logLines.push(line) }) });
  const base = server.url;
  const ep = await call(base, '/v1/endpoints', { method: 'POST', headers: AUTH, json: { url: sim.url, api_key: ENDPOINT_KEY } });
  expect(ep.status).toBe(201);
  endpointId = ep.body.id;
  await waitFor('endpoint ready', async () => ((await call(base, `/v1/endpoints/${endpointId}`, { headers: AUTH })).body.state === 'ready' ? true : undefined));

  const requests = Array.from({ length: SAMPLES }, (_, i) => ({ custom_id: `mcid-${i}`, messages: [{ role: 'user', content: `metrics question ${i}` }] }));
  const created = await call(base, '/v1/runs', {
    method: 'POST',
    headers: AUTH,
    json: {
      model: MODEL,
      input: { requests },
      shard_size: SHARD_SIZE,
      params: { max_tokens: 4096, chat_template_kwargs: { enable_thinking: true } },
      // Every degenerate answer is asked once more; no gate, so the run goes to the end.
      quality: { retry_flagged: 1, gate: false },
    },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  runId = created.body.id;

  midRun = await waitFor(
    'requests in flight',
    async () => {
      const m = await scrape(base);
      return m.value('regen_endpoint_in_flight', { endpoint_id: endpointId }) > 0 ? m : undefined;
    },
    60_000,
    50,
  );
  run = await waitFor('the run to finish', async () => {
    const r = (await call(base, `/v1/runs/${runId}`, { headers: AUTH })).body;
    return ['completed', 'failed', 'cancelled', 'paused'].includes(r.status) ? r : undefined;
  });
  expect(run.status).toBe('completed');
});

afterAll(async () => {
  await server?.close(2000);
  await sim?.stop();
  tmp.cleanup();
});

describe('GET /metrics', () => {
  it('needs the token when tokens are set', async () => {
    const res = await call(server.url, '/metrics');
    expect(res.status).toBe(401);
    expect((await call(server.url, '/metrics', { headers: { authorization: 'Bearer wrong' } })).status).toBe(401);
  });

  it('showed the endpoint busy, within its cap, while the run went on', () => {
    const inFlight = midRun.value('regen_endpoint_in_flight', { endpoint_id: endpointId });
    expect(inFlight).toBeGreaterThan(0);
    // What the server runs, plus the short queue the adaptive cap keeps behind it.
    const cap = midRun.value('regen_endpoint_max_concurrency', { endpoint_id: endpointId })!;
    expect(inFlight).toBeLessThanOrEqual(cap);
    expect(cap).toBeGreaterThanOrEqual(MAX_RUNNING);
    expect(cap).toBeLessThanOrEqual(serverCeiling(MAX_RUNNING));
    // One source, the server's own: its running limit, or its live load once that has been read.
    const sources = CAP_SOURCES.filter((source) =>
      midRun.series.some(
        (x) => x.name === 'regen_endpoint_max_concurrency_source' && x.labels.endpoint_id === endpointId && x.labels.source === source && x.value === 1,
      ),
    );
    expect(sources).toHaveLength(1);
    expect(['adaptive', 'server']).toContain(sources[0]);
    expect(midRun.value('regen_run_samples', { run_id: runId, status: 'in_progress' })).toBeGreaterThan(0);
  });

  it('agrees with the run, the endpoint and the simulator after the run', async () => {
    const m = await scrape(server.url);
    const stats = await sim.stats();

    const types: Record<string, string> = {
      regen_run_samples: 'gauge',
      regen_runs: 'gauge',
      regen_endpoint_in_flight: 'gauge',
      regen_endpoint_max_concurrency: 'gauge',
      regen_endpoint_state: 'gauge',
      regen_request_duration_seconds: 'histogram',
      regen_completion_tokens_total: 'counter',
      regen_retries_total: 'counter',
      regen_quality_flags_total: 'counter',
      regen_shard_uploads_total: 'counter',
      regen_shard_upload_failures_total: 'counter',
    };
    for (const [name, type] of Object.entries(types)) expect(m.types.get(name), name).toBe(type);

    // Samples by status: the run's own counters.
    for (const [status, n] of Object.entries(run.request_counts)) {
      if (status !== 'total') expect(m.value('regen_run_samples', { run_id: runId, status }), status).toBe(n);
    }
    expect(m.value('regen_runs', { status: 'completed' })).toBe(1);
    expect(m.value('regen_runs', { status: 'in_progress' })).toBe(0);

    // The endpoint: ready, idle, its cap read from the server.
    expect(m.value('regen_endpoint_state', { endpoint_id: endpointId, state: 'ready' })).toBe(1);
    expect(m.value('regen_endpoint_state', { endpoint_id: endpointId })).toBe(1);
    expect(m.value('regen_endpoint_in_flight', { endpoint_id: endpointId })).toBe(0);
    expect(m.value('regen_endpoint_max_concurrency', { endpoint_id: endpointId })).toBeLessThanOrEqual(serverCeiling(MAX_RUNNING));
    expect(m.value('regen_endpoint_info', { endpoint_id: endpointId, model: MODEL })).toBe(1);

    // Every answer the simulator gave was timed; each either completed a sample or was re-asked.
    const answered = m.value('regen_request_duration_seconds_count', { endpoint_id: endpointId });
    const qualityRetries = m.value('regen_retries_total', { reason: 'quality' });
    expect(answered).toBe(stats.completed);
    expect(answered).toBe(run.request_counts.completed + qualityRetries);
    expect(m.value('regen_request_duration_seconds_bucket', { endpoint_id: endpointId, le: '+Inf' })).toBe(answered);
    expect(m.value('regen_request_duration_seconds_sum', { endpoint_id: endpointId }) / answered).toBeGreaterThan(0.1);
    expect(m.value('regen_completion_tokens_total', { endpoint_id: endpointId })).toBe(run.usage.completion_tokens);
    // The run's own token counters, read from its usage (the Grafana dashboard's per-run tokens/s and cache hit rate).
    for (const kind of ['prompt', 'completion'] as const)
      expect(m.value(`regen_run_${kind}_tokens_total`, { run_id: runId, model: MODEL }), kind).toBe(run.usage[`${kind}_tokens`]);
    expect(run.usage.completion_tokens).toBeGreaterThan(0);
    expect(m.value('regen_run_cached_tokens_total', { run_id: runId, model: MODEL })).toBeLessThanOrEqual(run.usage.prompt_tokens);

    // Injected 500/503s were retried, unless a sample ran out of attempts.
    expect(stats.errors).toBeGreaterThan(0);
    expect(m.value('regen_retries_total', { reason: 'server_error' }) + run.request_counts.failed).toBe(stats.errors);
    for (const reason of ['timeout', 'connection_error']) expect(m.value('regen_retries_total', { reason }), reason).toBe(0);

    // Degenerate answers (empty think block, "OK."): flagged, re-asked once, and counted per flag.
    expect(qualityRetries).toBeGreaterThan(0);
    expect(m.value('regen_quality_flags_total', { flag: 'missing_reasoning' })).toBe(qualityRetries + run.quality.by_flag.missing_reasoning);
    for (const flag of FLAGS) {
      const raised = m.value('regen_quality_flags_total', { flag });
      if (RUN_RELATIVE.has(flag)) {
        // Judged against the run so far: an answer and its retry may differ.
        expect(raised, flag).toBeGreaterThanOrEqual(run.quality.by_flag[flag]);
        expect(raised, flag).toBeLessThanOrEqual(qualityRetries + run.quality.by_flag[flag]);
      } else expect([0, qualityRetries + run.quality.by_flag[flag]], flag).toContain(raised);
    }

    expect(m.value('regen_shard_uploads_total')).toBe(SAMPLES / SHARD_SIZE);
    expect(run.shards.uploaded).toBe(SAMPLES / SHARD_SIZE);
    expect(m.value('regen_shard_upload_failures_total')).toBe(0);
    expect(m.value('regen_event_streams')).toBe(0);

    // Low cardinality: ids of runs and endpoints at most, never a sample's.
    expect(m.text).not.toContain('mcid-');
    const allowed = new Set([
      'run_id',
      'status',
      'endpoint_id',
      'state',
      'name',
      'model',
      'reason',
      'flag',
      'le',
      'source',
      'result',
      'replica',
      'store',
      'role',
      'repair',
      'outcome',
    ]);

    // This process among replicas: one series naming it, its store and its runner's role.
    const replica = m.series.filter((s) => s.name === 'regen_replica_info');
    expect(replica).toEqual([
      {
        name: 'regen_replica_info',
        labels: { replica: `${hostname()}:${process.pid}`, store: onPg ? 'postgresql' : 'sqlite', role: onPg ? 'coordinating' : 'dispatching' },
        value: 1,
      },
    ]);
    for (const s of m.series.filter((x) => x.name.startsWith('regen_'))) {
      for (const label of Object.keys(s.labels)) expect(allowed.has(label), `${s.name} has label ${label}`).toBe(true);
    }
  });

  it("belongs to one server: another in the same process starts from zero, and the process's own metrics show once", async () => {
    const other = await startTestServer({ REGEN_RUNNER: 'false' });
    try {
      const text = await (await fetch(`${other.url}/metrics`)).text();
      const m = parseMetrics(text);
      // CPU, memory and the event loop, collected once per process for every server in it.
      expect(m.value('process_cpu_user_seconds_total')).toBeGreaterThan(0);
      expect(m.value('nodejs_eventloop_lag_seconds')).toBeGreaterThanOrEqual(0);
      expect(text.split('\n').filter((l) => l.startsWith('# TYPE process_cpu_user_seconds_total '))).toHaveLength(1);
      expect(m.value('regen_shard_uploads_total')).toBe(0);
      expect(m.value('regen_retries_total')).toBe(0);
      expect(m.value('regen_replica_info', { role: 'none' })).toBe(1);
      expect(m.series.some((s) => s.labels.run_id === runId || s.labels.endpoint_id === endpointId)).toBe(false);
      expect(m.value('regen_runs')).toBe(0);
    } finally {
      await other.cleanup();
    }
  });
});

describe('logs', () => {
  const parsed = () => logLines.map((l) => JSON.parse(l) as Record<string, any>);
  const infoOrAbove = () => parsed().filter((l) => l.level >= 30);

  it('has one line per run status change, matching the run events, and none per sample', async () => {
    const statusEvents = (await eventsAfter(server.deps.db, runId, 0)).filter((e) => e.type === 'status').map((e) => e.data.status);
    expect(statusEvents).toEqual(['validating', 'queued', 'in_progress', 'finalizing', 'completed']);
    const isStatus = (l: Record<string, any>) => l.run_id === runId && typeof l.status === 'string';
    // The runner thread's lines come as messages, after the database holds what they tell of.
    await waitFor('a line for each status change', async () => (infoOrAbove().filter(isStatus).length >= statusEvents.length ? true : undefined), 15_000).catch(
      () => undefined,
    );
    const lines = infoOrAbove();
    const statusLines = lines.filter(isStatus);
    expect(statusLines.map((l) => l.status)).toEqual(statusEvents);

    // Hundreds of answers, retries and flags, yet the run logged only its status changes.
    expect(lines.filter((l) => JSON.stringify(l).includes(runId) && !isStatus(l))).toEqual([]);
    expect(infoOrAbove().some((l) => JSON.stringify(l).includes('mcid-'))).toBe(false);
    expect(parsed().every((l) => l.service === 'regen' && typeof l.time === 'number' && typeof l.msg === 'string')).toBe(true);
  });

  it('has one line per endpoint state change', async () => {
    const states = () =>
      infoOrAbove()
        .filter((l) => l.endpoint_id === endpointId && typeof l.state === 'string')
        .map((l) => l.state);
    // The runner thread's lines reach this thread as messages, after the state they tell of is in the
    // database: the API can answer "ready" before the line is here, so the test waits for the line.
    const lineFor = (n: number) => waitFor(`${n} endpoint state lines`, async () => (states().length >= n ? true : undefined), 60_000).catch(() => undefined);
    const endpointLines = () =>
      JSON.stringify(
        parsed()
          .filter((l) => l.endpoint_id === endpointId)
          .map((l) => [l.msg, l.state]),
      );
    await lineFor(2);
    expect(states(), endpointLines()).toEqual(['starting', 'ready']);
    const patch = (state: string) => call(server.url, `/v1/endpoints/${endpointId}`, { method: 'PATCH', headers: AUTH, json: { state } });
    expect((await patch('draining')).status).toBe(200);
    expect((await patch('draining')).status).toBe(200);
    expect((await patch('ready')).status).toBe(200);
    await waitFor('endpoint ready again', async () =>
      (await call(server.url, `/v1/endpoints/${endpointId}`, { headers: AUTH })).body.state === 'ready' ? true : undefined,
    );
    // Re-registering a running server sends it back through a probe: two changes, two lines.
    expect((await call(server.url, '/v1/endpoints', { method: 'POST', headers: AUTH, json: { url: sim.url } })).status).toBe(200);
    await waitFor('endpoint ready after re-registration', async () =>
      (await call(server.url, `/v1/endpoints/${endpointId}`, { headers: AUTH })).body.state === 'ready' ? true : undefined,
    );
    await lineFor(7);
    expect(states(), endpointLines()).toEqual(['starting', 'ready', 'draining', 'starting', 'ready', 'starting', 'ready']);
  });

  it('tags request lines with the request id and never writes a token or an endpoint key', async () => {
    const res = await fetch(`${server.url}/v1/runs/${runId}`, { headers: { ...AUTH, 'x-request-id': 'obs-check-1' } });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-request-id')).toBe('obs-check-1');
    const line = parsed().find((l) => l.req_id === 'obs-check-1');
    expect(line).toMatchObject({ msg: 'request', method: 'GET', path: `/v1/runs/${runId}`, status: 200 });
    const problem = await call(server.url, '/v1/runs/run_absent', { headers: AUTH });
    expect(parsed().some((l) => l.req_id === problem.body.request_id && l.status === 404)).toBe(true);

    const all = logLines.join('');
    expect(all).not.toContain(TOKEN);
    expect(all).not.toContain(ENDPOINT_KEY);
    // Wherever a header or key lands in a logged object, it is censored.
    const out: string[] = [];
    const logger = makeLogger('info', { write: (l: string) => void out.push(l) });
    logger.info({ headers: { authorization: 'Bearer leak-1' }, endpoint: { api_key: 'leak-2' }, authorization: 'Bearer leak-3' }, 'x');
    expect(out.join('')).not.toMatch(/leak-/);
    expect(out.join('')).toContain('[redacted]');
  });
});
