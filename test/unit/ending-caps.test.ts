import { afterAll, describe, expect, it } from 'vitest';
import type { EndpointRow, RunRow } from '../../src/db/schema.js';
import { endingCaps } from '../../src/runner/ending-caps.js';
import { LiveEndpoint } from '../../src/runner/endpoints.js';

// The end of the work (src/runner/ending-caps.ts): once a model's runs are claimed to their last
// sample and what regen holds of them fits in the servers' queues, each endpoint is held to what its
// server runs at once. The caps are those the pump sends by (pump.ts fillSlots).

const CAP = 96;
const made: LiveEndpoint[] = [];
afterAll(() => {
  for (const e of made) e.close();
});

function endpoint(id: string, models: string[], maxRunning: number | null = 64): LiveEndpoint {
  const e = new LiveEndpoint({
    id,
    url: `http://127.0.0.1:9/${id}`,
    state: 'ready',
    weight: 1,
    model: models[0],
    aliases: models.slice(1),
    serverMaxRunning: maxRunning,
    kvTokens: null,
    lendUntil: null,
    schedule: null,
  } as unknown as EndpointRow);
  e.suspect = false;
  made.push(e);
  return e;
}

function run(id: string, fields: Partial<RunRow> = {}): RunRow {
  return { id, model: 'm', status: 'in_progress', pending: 0, regenerate: 'last_assistant', params: {}, ...fields } as RunRow;
}

function caps(endpoints: LiveEndpoint[], runs: RunRow[], buffered: Record<string, number>): Record<string, number> {
  return Object.fromEntries(
    endingCaps(
      endpoints,
      () => CAP,
      runs,
      (id) => buffered[id] ?? 0,
    ),
  );
}

describe('endingCaps', () => {
  const a = endpoint('a', ['m']);
  const b = endpoint('b', ['m']);

  it('holds each endpoint to its running limit once the runs are claimed to the last sample and what is left fits in the queues', () => {
    expect(caps([a, b], [run('r')], { r: 10 })).toEqual({ a: 64, b: 64 });
    // Exactly the queues' room (2 × 32): still the end.
    expect(caps([a, b], [run('r')], { r: 64 })).toEqual({ a: 64, b: 64 });
  });

  it('keeps the queues while samples are left to claim, or more is held than the queues take', () => {
    expect(caps([a, b], [run('r', { pending: 1 })], { r: 10 })).toEqual({ a: CAP, b: CAP });
    expect(caps([a, b], [run('r')], { r: 65 })).toEqual({ a: CAP, b: CAP });
    // Another run of the model still has samples to claim.
    expect(caps([a, b], [run('r'), run('s', { pending: 5 })], {})).toEqual({ a: CAP, b: CAP });
  });

  it('ignores a run that is not dispatched (paused)', () => {
    expect(caps([a, b], [run('r'), run('p', { status: 'paused', pending: 500 })], { r: 10 })).toEqual({ a: 64, b: 64 });
  });

  it('never for conversations, one server alone, or a server that does not say its running limit', () => {
    expect(caps([a, b], [run('r', { regenerate: 'all_assistant' })], {})).toEqual({ a: CAP, b: CAP });
    expect(caps([a], [run('r')], {})).toEqual({ a: CAP });
    const unknown = endpoint('u', ['m'], null);
    expect(caps([a, unknown], [run('r')], {})).toEqual({ a: CAP, u: CAP });
  });

  it('counts a request asking n answers as n of the server’s running slots', () => {
    const n2 = run('r', { params: { n: 2 } as RunRow['params'] });
    // 32 requests of 2 answers fill 64 slots; the queues hold 2 × (96 − 32) requests.
    expect(caps([a, b], [n2], { r: 256 })).toEqual({ a: 32, b: 32 });
    expect(caps([a, b], [n2], { r: 258 })).toEqual({ a: CAP, b: CAP });
  });

  it('leaves an endpoint that also serves a model still being claimed its queue, and the ending model’s other endpoints not', () => {
    const both = endpoint('both', ['m', 'other']);
    expect(caps([a, both], [run('r'), run('o', { model: 'other', pending: 3 })], {})).toEqual({ a: 64, both: CAP });
  });

  it('gives no cap to an endpoint that is not dispatchable', () => {
    const down = endpoint('down', ['m']);
    down.suspect = true;
    expect(caps([a, b, down], [run('r')], {})).toEqual({ a: 64, b: 64 });
  });
});
