export interface SimOptions {
  host?: string;
  port?: number;
  model?: string;
  maxRunning?: number;
  maxQueue?: number;
  startupMs?: number;
  ttftMs?: number;
  tokensPerSecond?: number;
  contextLength?: number;
  completionTokens?: number;
  reasoningTokens?: number;
  degenerateRate?: number;
  errorRate?: number;
  resetRate?: number;
  hangRate?: number;
  dieAfter?: number;
  seed?: number;
  /** Called when the `dieAfter`-th chat request arrives; by default the server drops every connection and stops listening. */
  onDie?: () => void;
}

/** The settings a simulator runs with: every option filled in. */
export type Knobs = Required<Omit<SimOptions, 'onDie'>>;

export const DEFAULTS: Readonly<Knobs> = {
  host: '127.0.0.1',
  port: 0,
  model: 'sim-model',
  maxRunning: 64,
  maxQueue: 1024,
  startupMs: 0,
  ttftMs: 0,
  tokensPerSecond: 0,
  contextLength: 32768,
  completionTokens: 64,
  reasoningTokens: 32,
  degenerateRate: 0,
  errorRate: 0,
  resetRate: 0,
  hangRate: 0,
  dieAfter: 0,
  seed: 1,
};

export class SimOptionError extends Error {}

interface Rule {
  expect: string;
  ok: (value: unknown) => boolean;
}

const isNumber = (value: unknown): value is number => typeof value === 'number' && Number.isFinite(value);
const isInteger = (value: unknown): value is number => Number.isInteger(value);

const text: Rule = { expect: 'a non-empty string', ok: (v) => typeof v === 'string' && v.length > 0 };
const rate: Rule = { expect: 'a number from 0 to 1', ok: (v) => isNumber(v) && v >= 0 && v <= 1 };
const duration: Rule = { expect: 'a non-negative number', ok: (v) => isNumber(v) && v >= 0 };
const count: Rule = { expect: 'a non-negative integer', ok: (v) => isInteger(v) && v >= 0 };
const positive: Rule = { expect: 'a positive integer', ok: (v) => isInteger(v) && v > 0 };

const RULES: Record<keyof Knobs, Rule> = {
  host: text,
  port: { expect: 'an integer from 0 to 65535', ok: (v) => isInteger(v) && v >= 0 && v <= 65535 },
  model: text,
  maxRunning: positive,
  maxQueue: count,
  startupMs: duration,
  ttftMs: duration,
  tokensPerSecond: duration,
  contextLength: positive,
  completionTokens: count,
  reasoningTokens: count,
  degenerateRate: rate,
  errorRate: rate,
  resetRate: rate,
  hangRate: rate,
  dieAfter: count,
  seed: { expect: 'an integer', ok: isInteger },
};

export const KNOB_NAMES = Object.keys(RULES) as (keyof Knobs)[];

// Listening address is fixed once the socket is bound.
const FIXED_AT_START = new Set<string>(['host', 'port']);

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isKnob(key: string): key is keyof Knobs {
  return Object.hasOwn(RULES, key);
}

/** Why `value` is not acceptable for `key` (e.g. "must be a positive integer"), or undefined when it is. */
export function knobProblem(key: keyof Knobs, value: unknown): string | undefined {
  const rule = RULES[key];
  return rule.ok(value) ? undefined : `must be ${rule.expect}`;
}

/** Validates a set of options, at start-up or as a runtime patch; throws SimOptionError naming the first bad one. */
export function checkKnobs(patch: unknown, when: 'start' | 'runtime'): Partial<Knobs> {
  if (!isRecord(patch)) throw new SimOptionError('simulator options must be a JSON object');
  const checked: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === undefined) continue;
    if (!isKnob(key)) throw new SimOptionError(`unknown simulator option "${key}"`);
    if (when === 'runtime' && FIXED_AT_START.has(key)) {
      throw new SimOptionError(`${key} cannot change while the simulator runs`);
    }
    const problem = knobProblem(key, value);
    if (problem) throw new SimOptionError(`${key} ${problem} (got ${JSON.stringify(value)})`);
    checked[key] = value;
  }
  return checked as Partial<Knobs>;
}
