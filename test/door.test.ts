// Mistakes caught at the door: each refusal names the field or line at fault and says the fix;
// a model no endpoint serves is created with a warning naming the closest served names.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { expectProblem, request } from './support/http.js';
import { createRun, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';
import { startTestServer, waitFor } from './support/server.js';

let server: Awaited<ReturnType<typeof startTestServer>>;
let sim: SimProcess;

// SGLang's default served name is its --model-path, a local folder.
const SERVED = '/models/Qwen3-8B';

beforeAll(async () => {
  [server, sim] = await Promise.all([startTestServer({ REGEN_PROBE_INTERVAL_MS: '200' }), spawnSimulator({ model: SERVED })]);
  const ep = await registerEndpoint(server.url, sim.url);
  await waitFor('the endpoint to say what it serves', async () => {
    const r = await request(server.url, `/v1/endpoints/${ep.id}`);
    return r.body.model === SERVED ? true : undefined;
  });
});
afterAll(async () => {
  await server?.cleanup();
  await sim?.stop();
});

const post = (path: string, json: unknown) => request(server.url, path, { method: 'POST', json });
const jsonl = (rows: unknown[]) => rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
const user = (content: string) => ({ role: 'user', content });
const runCount = async () => (await request(server.url, '/v1/runs?limit=1000')).body.data.length;

describe('roles', () => {
  const input = jsonl([
    { custom_id: 'a', messages: [user('one')] },
    { custom_id: 'b', messages: [{ role: 'human', content: 'two' }] },
    { custom_id: 'c', messages: [user('three')] },
  ]);

  it('a "human" turn fails the run naming the line, the role to write and how to skip such lines', async () => {
    const run = await createRun(server.url, { model: SERVED, input: { file_id: await uploadFile(server.url, input) } });
    const failed = await waitForStatus(server.url, run.id, ['failed', 'queued', 'in_progress', 'completed']);
    expect(failed.status).toBe('failed');
    expect(failed.status_reason).toBe(
      'input has 1 invalid line(s); first: line 2: messages[0].role "human" is not a chat role: write "user"; ' +
        'to run without them, create the run with on_invalid_line: "skip" (regen submit --on-invalid-line skip)',
    );
  });

  it('with on_invalid_line "skip" the line is skipped and listed, and the rest runs', async () => {
    const run = await createRun(server.url, { model: SERVED, on_invalid_line: 'skip', input: { file_id: await uploadFile(server.url, input) } });
    const done = await waitForStatus(server.url, run.id, ['failed', 'completed']);
    expect(done.status).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: 2, completed: 2 });
    expect(done.invalid_lines).toEqual({
      count: 1,
      errors: [{ line: 2, custom_id: 'b', message: 'messages[0].role "human" is not a chat role: write "user"' }],
    });
  });
});

describe('misplaced params', () => {
  it('refuses enable_thinking at the top level of params, saying where it belongs', async () => {
    const before = await runCount();
    const res = await post('/v1/runs', { model: SERVED, input: { requests: [{ messages: [user('q')] }] }, params: { enable_thinking: false } });
    expectProblem(res, 422, { code: 'validation_failed', field: 'params.enable_thinking' });
    expect(res.body.detail).toBe(
      'params.enable_thinking: belongs in chat_template_kwargs, as {"chat_template_kwargs": {"enable_thinking": false}}: only those reach the chat template, and SGLang ignores it at the top level',
    );
    expect(await runCount()).toBe(before);
  });

  it('refuses extra_body and a string enable_thinking, each naming its field', async () => {
    const extra = await post('/v1/runs', { model: SERVED, input: { requests: [{ messages: [user('q')] }] }, params: { extra_body: { top_k: 20 } } });
    expectProblem(extra, 422, { code: 'validation_failed', field: 'params.extra_body' });
    expect(extra.body.detail).toContain('write its fields in params directly');
    const text = await post('/v1/runs', {
      model: SERVED,
      input: { requests: [{ messages: [user('q')] }] },
      params: { chat_template_kwargs: { enable_thinking: 'false' } },
    });
    expectProblem(text, 422, { code: 'validation_failed', field: 'params.chat_template_kwargs.enable_thinking' });
    expect(text.body.detail).toContain('must be true or false (a JSON boolean)');
  });

  it("refuses enable_thinking in a line's params as an invalid line, naming the line and where it belongs", async () => {
    const run = await createRun(server.url, {
      model: SERVED,
      input: { requests: [{ messages: [user('q')] }, { messages: [user('q')], params: { enable_thinking: true } }] },
    });
    const failed = await waitForStatus(server.url, run.id, ['failed', 'queued', 'in_progress', 'completed']);
    expect(failed.status).toBe('failed');
    expect(failed.status_reason).toMatch(
      /^input has 1 invalid line\(s\); first: line 2: params\.enable_thinking: belongs in chat_template_kwargs, as \{"chat_template_kwargs": \{"enable_thinking": true\}\}.*on_invalid_line: "skip"/,
    );
  });
});

describe('a model no endpoint serves', () => {
  it('is created (201) with a warning naming the closest served name, compared by last path segment', async () => {
    const res = await post('/v1/runs', { model: 'Qwen/Qwen3-8b', input: { requests: [{ messages: [user('q')] }] } });
    expect(res.status, res.text).toBe(201);
    expect(res.body.warnings).toEqual([
      {
        code: 'model_not_served',
        field: 'model',
        message: `model "Qwen/Qwen3-8b" is not served by any registered endpoint (did you mean "${SERVED}"?); the run waits until an endpoint serves it`,
        suggestions: [SERVED],
      },
    ]);
    await request(server.url, `/v1/runs/${res.body.id}/cancel`, { method: 'POST' });
  });

  it('lists what the endpoints serve when no name is close, and warns of nothing for a served model', async () => {
    const far = await post('/v1/runs', { model: 'meta-llama/Llama-3.1-70B', input: { requests: [{ messages: [user('q')] }] } });
    expect(far.status, far.text).toBe(201);
    expect(far.body.warnings).toMatchObject([{ suggestions: [], message: expect.stringContaining(`(the endpoints serve "${SERVED}"); the run waits`) }]);
    await request(server.url, `/v1/runs/${far.body.id}/cancel`, { method: 'POST' });

    const served = await post('/v1/runs', { model: 'Qwen/Qwen3-8B', input: { requests: [{ messages: [user('q')] }] } });
    expect(served.status, served.text).toBe(201);
    expect(served.body.warnings).toEqual([]);
    await waitForStatus(server.url, served.body.id, ['completed']);
  });
});

describe('POST /v1/runs/validate', () => {
  it('answers 200 with the warnings and creates nothing; the input may be left out', async () => {
    const before = await runCount();
    const res = await post('/v1/runs/validate', { model: 'Qwen/Qwen3-8b', params: { temperature: 0.6 } });
    expect(res.status, res.text).toBe(200);
    expect(res.body).toMatchObject({ object: 'run.validation', warnings: [{ code: 'model_not_served', suggestions: [SERVED] }] });
    expect((await post('/v1/runs/validate', { model: SERVED })).body).toEqual({ object: 'run.validation', warnings: [] });
    expect(await runCount()).toBe(before);
  });

  it('refuses what the create would, with the same problem', async () => {
    const hot = await post('/v1/runs/validate', { model: SERVED, params: { temperature: 7 } });
    expectProblem(hot, 422, { code: 'validation_failed', field: 'params.temperature' });
    const created = await post('/v1/runs', { model: SERVED, input: { requests: [{ messages: [user('q')] }] }, params: { temperature: 7 } });
    expect(created.body.detail).toBe(hot.body.detail);
    expectProblem(await post('/v1/runs/validate', { model: SERVED, input: { file_id: 'file_gone' } }), 404, { code: 'not_found', field: 'input.file_id' });
    expectProblem(await post('/v1/runs/validate', { model: SERVED, dry_run: true, calibration: { samples: 0 } }), 422, {
      code: 'validation_failed',
      field: 'calibration.samples',
    });
    expectProblem(await post('/v1/runs/validate', { model: SERVED, wat: 1 }), 422, { code: 'validation_failed', field: 'wat' });
  });
});
