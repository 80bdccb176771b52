import { afterEach, describe, expect, it, vi } from 'vitest';
import { startSimulator, type Simulator, type SimOptions } from '../src/sim/server.js';

// The simulator schedules by priority as SGLang does (docs/sglang.md "Priority"): one slot, so
// the order in which queued requests run is the order in which they answer.

const opened: Simulator[] = [];
afterEach(async () => {
  await Promise.all(opened.splice(0).map((sim) => sim.close()));
});

async function start(options: SimOptions): Promise<Simulator> {
  const sim = await startSimulator({ maxRunning: 1, ttftMs: 150, completionTokens: 8, reasoningTokens: 0, ...options });
  opened.push(sim);
  return sim;
}

interface Sent {
  name: string;
  answer: Promise<string>;
}

/** Sends a request; the caller waits for the simulator to hold it (running or queued), so that arrival order is fixed. */
function send(sim: Simulator, name: string, priority: number | undefined, finished: string[], extra: object = {}): Sent {
  const body = { messages: [{ role: 'user', content: `request ${name}` }], priority, ...extra };
  const answer = fetch(`${sim.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify(body) }).then(async (res) => {
    expect(res.status).toBe(200);
    const text = await res.text();
    finished.push(name);
    return text;
  });
  return { name, answer };
}

/**
 * A hung blocker holds the one slot while the others queue behind it in the given order, then its
 * client gives up; returns the order in which the others answered.
 */
async function order(options: SimOptions, queued: [string, number | undefined][]): Promise<string[]> {
  const sim = await start({ ...options, hangRate: 1 });
  const finished: string[] = [];
  const blocker = new AbortController();
  const hung = fetch(`${sim.url}/v1/chat/completions`, {
    method: 'POST',
    body: JSON.stringify({ messages: [{ role: 'user', content: 'blocker' }], priority: 100 }),
    signal: blocker.signal,
  }).catch(() => undefined);
  await vi.waitFor(() => expect(sim.stats().running).toBe(1));
  sim.configure({ hangRate: 0 });
  const sent: Sent[] = [];
  for (const [name, priority] of queued) {
    sent.push(send(sim, name, priority, finished));
    await vi.waitFor(() => expect(sim.stats().queued).toBe(sent.length));
  }
  blocker.abort();
  await hung;
  await Promise.all(sent.map((s) => s.answer));
  return finished;
}

/** Sends a request and waits until it runs. */
async function running(sim: Simulator, name: string, priority: number, finished: string[], extra: object = {}): Promise<Sent> {
  const sent = send(sim, name, priority, finished, extra);
  await vi.waitFor(() => expect(sim.stats().running).toBe(1));
  return sent;
}

const QUEUED: [string, number | undefined][] = [
  ['zero', 0],
  ['five', 5],
  ['none', undefined],
  ['also-five', 5],
];

describe('simulator: priority scheduling', () => {
  it('without --enable-priority-scheduling, ignores priority: first come, first served', async () => {
    expect(await order({}, QUEUED)).toEqual(['zero', 'five', 'none', 'also-five']);
  });

  it('runs the larger value first, arrival order among equals, and a request without priority last', async () => {
    // No preemption here: every queued request is within the threshold of the blocker or below it.
    expect(await order({ enablePriorityScheduling: 1 }, QUEUED)).toEqual(['five', 'also-five', 'zero', 'none']);
  });

  it('runs the smaller value first with --schedule-low-priority-values-first; no priority still goes last', async () => {
    const got = await order({ enablePriorityScheduling: 1, scheduleLowPriorityValuesFirst: 1, disablePriorityPreemption: 1 }, QUEUED);
    expect(got).toEqual(['zero', 'five', 'also-five', 'none']);
  });

  it('gives a request without priority --default-priority-value', async () => {
    expect(await order({ enablePriorityScheduling: 1, defaultPriorityValue: 3 }, QUEUED)).toEqual(['five', 'also-five', 'none', 'zero']);
  });

  it('preempts a running request outranked by more than the threshold; the preempted one still answers in full', async () => {
    // Long enough an answer that the person's request arrives while the bulk one runs, even on a busy machine.
    const options = { enablePriorityScheduling: 1, ttftMs: 1000 };
    const plain = await start(options);
    const reference = send(plain, 'bulk', -11, []);
    const sim = await start(options);
    const finished: string[] = [];
    const bulk = await running(sim, 'bulk', -11, finished);
    // 0 − (−11) = 11 > 10: the person's request takes the slot at once.
    const person = send(sim, 'person', 0, finished);
    await vi.waitFor(() => expect(sim.stats().preempted).toBe(1));
    expect(sim.stats().running).toBe(1);
    expect(sim.stats().queued).toBe(1);
    const [bulkText] = await Promise.all([bulk.answer, person.answer]);
    expect(finished).toEqual(['person', 'bulk']);
    // The client sees only latency: the same answer as on a server that never preempted it.
    expect(strip(bulkText)).toEqual(strip(await reference.answer));
    expect(sim.stats()).toMatchObject({ completed: 2, preempted: 1, aborted: 0 });
  });

  it('does not preempt at exactly the threshold, nor for a request without priority', async () => {
    const sim = await start({ enablePriorityScheduling: 1, ttftMs: 1000 });
    const finished: string[] = [];
    const bulk = await running(sim, 'bulk', -10, finished);
    const person = send(sim, 'person', 0, finished);
    await vi.waitFor(() => expect(sim.stats().queued).toBe(1));
    const anonymous = send(sim, 'anonymous', undefined, finished);
    await vi.waitFor(() => expect(sim.stats().queued).toBe(2));
    await Promise.all([bulk.answer, person.answer, anonymous.answer]);
    expect(finished).toEqual(['bulk', 'person', 'anonymous']);
    expect(sim.stats().preempted).toBe(0);
  });

  it('a preempted stream pauses and goes on: every piece arrives once, in order', async () => {
    const options = { enablePriorityScheduling: 1, ttftMs: 20, tokensPerSecond: 40, completionTokens: 60 };
    const plain = await start(options);
    const reference = send(plain, 'bulk', -20, [], { stream: true });
    const sim = await start(options);
    const finished: string[] = [];
    const bulk = await running(sim, 'bulk', -20, finished, { stream: true });
    const person = send(sim, 'person', 0, finished);
    await Promise.all([bulk.answer, person.answer]);
    expect(finished).toEqual(['person', 'bulk']);
    expect(sim.stats().preempted).toBe(1);
    expect(contentOf(await bulk.answer)).toBe(contentOf(await reference.answer));
  });
});

/** An answer without the fields that differ between two servers (id, created time). */
function strip(text: string): unknown {
  const { id: _id, created: _created, ...rest } = JSON.parse(text);
  return rest;
}

/** The text a streamed answer carries, from its pieces in order. */
function contentOf(events: string): string {
  return events
    .split('\n')
    .filter((line) => line.startsWith('data: {'))
    .map((line) => JSON.parse(line.slice(6)).choices?.[0]?.delta?.content ?? '')
    .join('');
}
