import { parseArgs } from 'node:util';
import { DEFAULTS, KNOB_NAMES, knobProblem, type Knobs } from './options.js';
import { startSimulator, type Simulator } from './server.js';

/** maxRunning → max-running */
const flagName = (knob: string): string => knob.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);

const FLAGS = new Map(KNOB_NAMES.map((knob) => [flagName(knob), knob]));

// The KV model's knobs interact: a word on each (options.ts has the full story).
const NOTES: Partial<Record<keyof Knobs, string>> = {
  kvTokens: 'KV pool per DP rank in tokens; 0: no KV model, only --max-running binds',
  kvAdmission: "optimistic: SGLang's reservation rule; none: only the running limit admits, an over-committed pool thrashes",
  prefillTokensPerSecond: 'KV model: prefill and re-prefill speed; 0 is instant',
  retractStallMs: 'KV model: extra stall per retraction',
};

const USAGE = [
  'usage: regen sim [flags]   an SGLang look-alike for tests, benchmarks and the demo',
  ...KNOB_NAMES.map((knob) => {
    const line = `  --${flagName(knob)} ${DEFAULTS[knob]}`;
    const note = NOTES[knob];
    return note ? `${line.padEnd(36)} ${note}` : line;
  }),
].join('\n');

class UsageError extends Error {}

// Number('') is 0, which would let `--port ''` through silently.
const toNumber = (raw: string): number => (raw.trim() === '' ? NaN : Number(raw));

function parseFlags(argv: string[]): Partial<Knobs> | 'help' {
  const options = Object.fromEntries([...FLAGS.keys()].map((flag) => [flag, { type: 'string' as const }]));
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({ args: argv, options: { ...options, help: { type: 'boolean', short: 'h' } } }));
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  if (values.help) return 'help';
  const knobs: Record<string, string | number> = {};
  for (const [flag, knob] of FLAGS) {
    const raw = values[flag];
    if (typeof raw !== 'string') continue;
    // A knob whose default is null (not given) takes a number too.
    const value = typeof DEFAULTS[knob] === 'number' || DEFAULTS[knob] === null ? toNumber(raw) : raw;
    const problem = knobProblem(knob, value);
    if (problem) throw new UsageError(`--${flag} ${problem} (got ${JSON.stringify(raw)})`);
    knobs[knob] = value;
  }
  return knobs as Partial<Knobs>;
}

// A crash, not a shutdown: in-flight requests see their connection drop.
function die(): never {
  process.stderr.write('regen sim: exiting on purpose (--die-after reached)\n');
  process.exit(1);
}

/**
 * `regen sim`: starts the simulator, prints one JSON line `{"event":"listening",url,port,pid}`
 * on stdout once it accepts connections, drains on SIGTERM (a second one closes at once) and
 * closes on SIGINT. Bad flags exit with code 2.
 */
export async function runSimCommand(argv: string[]): Promise<void> {
  let knobs: Partial<Knobs> | 'help';
  try {
    knobs = parseFlags(argv);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(`regen sim: ${error.message}\n`);
    process.exitCode = 2;
    return;
  }
  if (knobs === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  let sim: Simulator;
  try {
    sim = await startSimulator({
      ...knobs,
      onDie: die,
      onDrained: (stats) => process.stdout.write(`${JSON.stringify({ event: 'drained', stats })}\n`),
    });
  } catch (error) {
    process.stderr.write(`regen sim: cannot listen: ${(error as Error).message}\n`);
    process.exitCode = 1;
    return;
  }
  process.stdout.write(`${JSON.stringify({ event: 'listening', url: sim.url, port: sim.port, pid: process.pid })}\n`);
  // SIGTERM is SGLang's graceful exit: /health turns 503, requests already sent go on to finish
  // (new ones are still taken, as SGLang's routes never check), and the process exits once idle.
  const drain = (): void => {
    process.off('SIGTERM', drain);
    process.once('SIGTERM', close);
    void sim.drain();
  };
  // Once the listeners are gone, a further signal kills the process the default way.
  const close = (): void => {
    process.off('SIGTERM', drain);
    process.off('SIGTERM', close);
    process.off('SIGINT', close);
    void sim.close();
  };
  process.on('SIGTERM', drain);
  process.on('SIGINT', close);
}
