import { mulberry32 } from '../../src/domain/forecast.js';

// How true a conversation run's ETA is: a run of uneven conversations (1–6 turns, answers of
// 20–180 tokens asked with the simulator's "[len=N]") on slow simulators, its `eta_seconds` read at
// a third and at two thirds of its turns and set against the time the run really took from there.
// Both sides are measured in the same run, so a loaded machine slows them alike.

export const ETA_POINTS = [1 / 3, 2 / 3] as const;

/** Within this of the actual remaining time, at each point. */
export const ETA_TOLERANCE = 0.15;

/**
 * Two fleets of two simulators: one the conversations queue for (16 slots for 160), and one with a
 * slot for every conversation, where their chains of turns, not the fleet's rate, set the time left.
 */
export const ETA_FLEETS = [
  { name: 'queued', conversations: 160, slots: 8, tokensPerSecond: 100 },
  { name: 'chains', conversations: 60, slots: 40, tokensPerSecond: 40 },
] as const;
export type EtaFleet = (typeof ETA_FLEETS)[number];

/** A simulator of the fleet: each request decodes `tokensPerSecond`, `slots` at once. */
export const etaSimulator = (fleet: EtaFleet) => ({ 'ttft-ms': 40, 'tokens-per-second': fleet.tokensPerSecond, 'max-running': fleet.slots });

/** The run: the fleet's conversations, thinking off (the answers are the lengths asked for), the gate off. */
export const etaRun = (fleet: EtaFleet) => ({
  model: 'sim-model',
  regenerate: 'all_assistant',
  input: { requests: unevenConversations(fleet.conversations).map((l) => JSON.parse(l)) },
  params: { chat_template_kwargs: { enable_thinking: false } },
  quality: { gate: false },
});

/** One input line a conversation: its user turns each ask for an answer of their own length; its old replies are dropped by the walk. */
export function unevenConversations(n: number, seed = 37): string[] {
  const r = mulberry32(seed);
  return Array.from({ length: n }, (_, i) => {
    const turns = 1 + Math.floor(r() * 6);
    const messages: { role: string; content: string }[] = [];
    for (let k = 0; k < turns; k++) {
      messages.push({ role: 'user', content: `Conversation ${i}, turn ${k} [len=${20 + Math.floor(r() * 161)}]` });
      messages.push({ role: 'assistant', content: 'an old reply' });
    }
    return JSON.stringify({ custom_id: `eta-${i}`, messages });
  });
}

export interface EtaReading {
  /** The share of the turns answered when the ETA was read. */
  at: number;
  eta: number;
  actual: number;
  /** (eta − actual) / actual. */
  error: number;
  /** How many readings the figure is the median of (1 without a span). */
  readings: number;
  /** The error of the first reading past the point. */
  first: number;
}

type Get = (path: string) => Promise<any>;

/**
 * Follows the run to its end, reading its ETA at every poll; the actual remaining time is from a
 * reading to the run's last answer. At each of ETA_POINTS the figure is the first reading past the
 * point, or with `span` the reading of median error among those from there to `span` more of the
 * turns: an ETA read at one instant carries the pace of the seconds before it, which a loaded
 * machine's passing burst (another test file starting a browser) can halve.
 */
export async function followEta(get: Get, runId: string, opts: { span?: number; pollMs?: number; timeoutMs?: number } = {}): Promise<EtaReading[]> {
  const { span = 0, pollMs = 100, timeoutMs = 600_000 } = opts;
  const polls: { at: number; eta: number | null; t: number }[] = [];
  const started = Date.now();
  for (;;) {
    if (Date.now() - started > timeoutMs) throw new Error(`run ${runId} did not end within ${timeoutMs} ms`);
    const t = Date.now();
    const run = await get(`/v1/runs/${runId}`);
    const turns = run.turns;
    const share = turns && turns.total > 0 ? turns.completed / turns.total : 0;
    // The last answer: every conversation settled (the upload that follows is not the forecast's).
    if (run.request_counts.pending === 0 && run.request_counts.in_progress === 0 && run.request_counts.total > 0) {
      return ETA_POINTS.map((point) => {
        const past = polls.filter((r) => r.at >= point);
        if (past.length === 0) throw new Error(`run ${runId} ended before its ETA was read at ${(100 * point).toFixed(0)}% of its turns`);
        const stretch = span > 0 ? past.filter((r) => r.at <= past[0].at + span) : [past[0]];
        const readings = stretch.map((r) => {
          const actual = (t - r.t) / 1000;
          if (r.eta === null) throw new Error(`run ${runId} had no ETA at ${(100 * r.at).toFixed(0)}% of its turns`);
          return { at: r.at, eta: r.eta, actual, error: (r.eta - actual) / actual };
        });
        const first = readings[0].error;
        readings.sort((a, b) => a.error - b.error);
        return { ...readings[Math.floor((readings.length - 1) / 2)], readings: readings.length, first };
      });
    }
    polls.push({ at: share, eta: run.progress.eta_seconds, t });
    if (['failed', 'cancelled', 'paused'].includes(run.status)) throw new Error(`run ${runId} ${run.status}: ${run.status_reason}`);
    await new Promise((resolve) => setTimeout(resolve, pollMs));
  }
}
