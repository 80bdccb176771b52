import { describe, expect, it } from 'vitest';
import type { EndpointRow } from '../../src/db/schema.js';
import { AFFINITY_WAIT_MS, pickEndpoint, pickForSlot, type Waiting } from '../../src/runner/endpoint-choice.js';
import { LiveEndpoint } from '../../src/runner/endpoints.js';

const at = (affinityEndpointId: string | null, since = 0): Waiting => ({ affinityEndpointId, since });
const allReady = (): boolean => true;

describe('the affinity rule (pickForSlot)', () => {
  it('gives a slot the sample whose prefix is cached on its endpoint, before any other', () => {
    const waiting = [at(null), at('b'), at('a'), at('a')];
    expect(pickForSlot(waiting, 'a', allReady, 0, false)).toBe(2);
  });

  it('takes other due work first: a sample held for another ready endpoint waits', () => {
    const waiting = [at('b'), at(null), at('c')];
    expect(pickForSlot(waiting, 'a', allReady, 0, false)).toBe(1);
    // Nothing else due, but the held samples have not waited long enough: they stay.
    expect(pickForSlot([at('b', 0), at('c', 10)], 'a', allReady, AFFINITY_WAIT_MS - 1, true)).toBe(-1);
  });

  it('moves a sample at once when its endpoint is not ready', () => {
    const ready = (id: string): boolean => id !== 'b';
    expect(pickForSlot([at('c'), at('b')], 'a', ready, 0, false)).toBe(1);
  });

  it('moves the longest waiting sample after about 2 s, only when nothing else is due for the slot', () => {
    const waiting = [at('b', 500), at('c', 100), at('b', 300)];
    const now = 100 + AFFINITY_WAIT_MS;
    // Another run still has work for the slot: the pump asks with moveWaited false first.
    expect(pickForSlot(waiting, 'a', allReady, now, false)).toBe(-1);
    expect(pickForSlot(waiting, 'a', allReady, now, true)).toBe(1);
    // Free work in the same buffer comes before a move.
    expect(pickForSlot([...waiting, at(null, 900)], 'a', allReady, now, true)).toBe(3);
  });

  it('never idles a slot while work is due for it', () => {
    // Every mix of held, free and stale samples: whenever one is due for the slot, one is given.
    const homes = [null, 'a', 'b', 'down'];
    const ready = (id: string): boolean => id !== 'down';
    for (let mask = 0; mask < 4 ** 4; mask++) {
      const waiting: Waiting[] = [];
      for (let k = 0, m = mask; k < 4; k++, m >>= 2) waiting.push(at(homes[m & 3], k * 1000));
      for (const moveWaited of [false, true]) {
        const now = 2500;
        const due = waiting.some(
          (w) =>
            w.affinityEndpointId === null || w.affinityEndpointId === 'a' || !ready(w.affinityEndpointId) || (moveWaited && now - w.since >= AFFINITY_WAIT_MS),
        );
        const i = pickForSlot(waiting, 'a', ready, now, moveWaited);
        expect(i >= 0).toBe(due);
      }
    }
  });

  it('never exceeds a cap: the slot comes from pickEndpoint, which gives none to a full endpoint', () => {
    const endpoints = [
      { id: 'a', cap: 2, inFlight: 2 },
      { id: 'b', cap: 2, inFlight: 1 },
    ];
    const slots = (e: (typeof endpoints)[number]) => ({ cap: e.cap, inFlight: e.inFlight, weight: 1 });
    expect(pickEndpoint(endpoints, slots)?.id).toBe('b');
    endpoints[1].inFlight = 2;
    // Samples held for 'a' wait: no endpoint has a slot, whatever the buffer holds.
    expect(pickEndpoint(endpoints, slots)).toBeNull();
  });
});

describe('affinity across a restart (LiveEndpoint.holdsAffinity)', () => {
  const loaded = (state: string) => new LiveEndpoint({ id: 'b', url: 'http://127.0.0.1:9', state, weight: 1 } as unknown as EndpointRow);

  it('keeps the turns of an endpoint stored as ready while its first probe is out', () => {
    const b = loaded('ready');
    // Just loaded: nothing is sent there before a probe, but its conversations wait for it.
    expect(b.dispatchable).toBe(false);
    expect(b.holdsAffinity).toBe(true);
    const ready = (id: string) => (id === 'b' ? b.holdsAffinity : true);
    // Endpoint a's probe came back first: its free slot takes new work, not b's conversation.
    expect(pickForSlot([at('b'), at(null)], 'a', ready, 0, false)).toBe(1);
    expect(pickForSlot([at('b')], 'a', ready, 0, false)).toBe(-1);
  });

  it('lets them move once a probe has failed, or when the endpoint was not ready', () => {
    const b = loaded('ready');
    b.unprobed = false;
    expect(b.holdsAffinity).toBe(false);
    expect(loaded('draining').holdsAffinity).toBe(false);
    expect(loaded('unhealthy').holdsAffinity).toBe(false);
  });
});
