import { InvalidArgumentError, Option, type Command } from 'commander';
import { RUN_ENDPOINTS } from '../domain/run-endpoint.js';
import { ApiCallError, DEFAULT_SERVER, UsageError } from './client.js';

// Exit codes: 0 done, 1 the server refused or the run failed, 2 a usage error (here or a request
// the server found invalid), 3 a watched run paused by the quality gate.
async function run(action: () => Promise<number>): Promise<void> {
  try {
    process.exitCode = await action();
  } catch (err) {
    const usage = err instanceof UsageError || (err instanceof ApiCallError && (err.status === 400 || err.status === 422));
    const hint = err instanceof ApiCallError && err.status === 401 ? ' (set REGEN_TOKEN)' : '';
    process.stderr.write(`regen: ${(err as Error).message}${hint}\n`);
    process.exitCode = usage ? 2 : 1;
  }
}

/**
 * A whole number from 1 to `max`. Past Number.MAX_SAFE_INTEGER a number's digits no longer survive
 * (99999999999999999999 reads as 100000000000000000000), so that is the bound where a flag has none
 * of its own: the server bounds what it is sent, with the field named.
 */
export const positiveInt =
  (what: string, max = Number.MAX_SAFE_INTEGER) =>
  (value: string) => {
    const n = Number(value);
    if (!/^\d+$/.test(value) || n < 1 || n > max) throw new InvalidArgumentError(`${what} must be a whole number from 1 to ${max.toLocaleString('en-US')}`);
    return n;
  };

/** `plan --endpoints`: far past any fleet, so that a number this large is taken for the typo it is. */
const MAX_PLANNED_ENDPOINTS = 100_000;

/** A share strictly between 0 and 1, the whole argument a number: parseFloat would read `0.5x` as 0.5 and `abc` as NaN. */
const shareArg = (what: string) => (value: string) => {
  const n = /^\s*[+]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*$/i.test(value) ? Number(value) : Number.NaN;
  if (!(n > 0 && n < 1)) throw new InvalidArgumentError(`${what} must be a number between 0 and 1, such as 0.05`);
  return n;
};

const SECONDS_PER: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86_400 };

/** "72h", "90m", "2d", "3600s" or "3600" (seconds) → seconds. */
const durationArg = (what: string) => (value: string) => {
  const m = /^(\d+(?:\.\d+)?)([smhd]?)$/.exec(value.trim());
  const seconds = m ? Math.round(Number(m[1]) * SECONDS_PER[m[2] || 's']) : Number.NaN;
  if (!(seconds >= 1)) throw new InvalidArgumentError(`${what} must be a duration such as 72h, 90m, 2d or 3600s`);
  return seconds;
};

const collect = (value: string, previous: string[]) => [...previous, value];

/** Adds what every client command has: which server to talk to, and a one-line hint after a usage error. */
function client(cmd: Command): Command {
  const name = [cmd.parent?.parent ? cmd.parent.name() : null, cmd.name()].filter(Boolean).join(' ');
  return cmd
    .showHelpAfterError(`(regen ${name} --help shows the usage)`)
    .option('--server <url>', `regen server (REGEN_URL, default ${DEFAULT_SERVER}); REGEN_TOKEN is sent as the bearer token`);
}

/** The settings an operator lending a server gives: on `endpoints add` and `endpoints set`. */
function sharing(cmd: Command): Command {
  return cmd
    .option('--request-priority <n|none>', "SGLang's `priority` sent on every request (with --enable-priority-scheduling)")
    .option('--bulk-header <on|off>', 'send `x-smg-priority: bulk` (behind the SGLang model gateway)')
    .option(
      '--share <reserve_slots,max_other_queue|none>',
      "yield to others' load: keep this many slots free, send nothing while more than this many of theirs wait",
    )
    .option('--schedule <windows|none>', 'when regen may use it: "mon-fri 20:00-07:00; sat,sun 00:00-24:00"')
    .option('--timezone <zone>', "the schedule's IANA time zone (default UTC)")
    .option('--lend-until <time|none>', 'an RFC 3339 time after which regen sends nothing new')
    .option('--drain-grace <ms|none>', 'off schedule, give back the requests still running after this long (default: let them finish)');
}

/** The commands that talk to a running server: submit, plan, status, export, endpoints, runs. */
export function registerClientCommands(program: Command): void {
  client(program.command('submit'))
    .description('check the run, upload a JSONL file of prompts and create the run; prints the run id, then how it stands once its input is validated')
    .argument('<file>', 'prompts, one JSON object a line (native, OpenAI batch, ShareGPT or {"id","prompt"})')
    .requiredOption('--model <model>', 'the model the endpoints serve')
    .option(
      '--param <key=value>',
      'a generation param, repeatable; dotted keys nest, values are JSON when they parse (temperature=0.6, chat_template_kwargs.enable_thinking=true)',
      collect,
      [],
    )
    .option('--name <name>', 'a name for the run')
    .option('--shard-size <n>', 'samples per output shard', positiveInt('--shard-size'))
    .addOption(
      new Option(
        '--regenerate <what>',
        'last_assistant: drop a trailing assistant turn and ask it again; all_assistant: ask every assistant turn again, in order',
      ).choices(['last_assistant', 'all_assistant']),
    )
    .addOption(
      new Option(
        '--on-invalid-line <what>',
        'fail: an invalid line fails the run (the default); skip: run without the invalid lines, counted and listed',
      ).choices(['fail', 'skip']),
    )
    .addOption(
      new Option(
        '--on-length <what>',
        'an answer cut by max_tokens: keep (flagged truncated, the default), retry (with max_tokens doubled, up to the context), fail',
      ).choices(['keep', 'retry', 'fail']),
    )
    .addOption(
      new Option(
        '--endpoint <route>',
        "the server route each line goes to: /v1/chat/completions (the default), /v1/completions (a line's `prompt`, sent raw) or /v1/embeddings (a line's `input`)",
      ).choices([...RUN_ENDPOINTS]),
    )
    .option('--variants <json>', 'the run\'s variants, a JSON array inline or @file: [{"name": "think", "weight": 3, "params": {…}}, …]')
    .addOption(
      new Option('--format <format>', 'how the shards are written: jsonl (the default), conversations (SpecForge) or parquet (with a dataset card)').choices([
        'jsonl',
        'conversations',
        'parquet',
      ]),
    )
    .option(
      '--eval-share <share>',
      'put this share of samples (0 < share < 1, by a stable hash of the custom_id) under eval/, the rest under train/',
      shareArg('--eval-share'),
    )
    .option('--watch', 'follow the run with a progress bar; exit 0 completed, 1 failed or cancelled, 3 paused by the quality gate')
    .action((file, opts) => run(async () => (await import('./submit.js')).submitCommand(file, opts)));

  client(program.command('plan'))
    .description(
      'dry-run a sample of a file (the size of a calibration slice) and print the forecast for the whole file: tokens, wall time, endpoint-hours, endpoints for a deadline',
    )
    .argument('<file>', 'prompts, as for submit')
    .requiredOption('--model <model>', 'the model the endpoints serve')
    .option('--param <key=value>', 'a generation param, repeatable, as for submit', collect, [])
    .option('--samples <n>', 'lines of the file to upload and answer (default 200, the calibration slice)', positiveInt('--samples'))
    .option('--deadline <duration>', 'when the run should be done (72h, 90m, 2d): how many endpoints would meet it', durationArg('--deadline'))
    .option('--endpoints <n>', 'also give the wall time on this many endpoints like the ones measured', positiveInt('--endpoints', MAX_PLANNED_ENDPOINTS))
    .addOption(
      new Option(
        '--regenerate <what>',
        'last_assistant: drop a trailing assistant turn and ask it again; all_assistant: ask every assistant turn again, in order',
      ).choices(['last_assistant', 'all_assistant']),
    )
    .action((file, opts) => run(async () => (await import('./plan.js')).planCommand(file, opts)));

  client(program.command('status'))
    .description('a table of runs, or one run in detail')
    .argument('[run]', 'a run id')
    .option('--watch', 'with a run: follow it with a progress bar until it ends')
    .action((runId, opts) => run(async () => (await import('./status.js')).statusCommand(runId, opts)));

  client(program.command('export'))
    .description("write a run's completed samples as one file, each shard checked against the run's manifest (for tools that take one file)")
    .argument('<run>', 'a run id: one that ended with its shards written')
    .addOption(new Option('--split <split>', 'only this split of a run made with a split').choices(['train', 'eval']))
    .option('--variant <name>', 'only the samples of this variant')
    .addOption(
      new Option('--format <format>', "the file's format: the run's own by default (jsonl for jsonl and conversations runs)").choices(['jsonl', 'parquet']),
    )
    .option('-o, --output <file>', 'write to this file (whole or not at all: written beside it, then renamed); default stdout')
    .action((runId, opts) => run(async () => (await import('./export.js')).exportCommand(runId, opts)));

  const endpoints = program.command('endpoints').description('the SGLang servers the runs are sent to');
  sharing(
    client(endpoints.command('add'))
      .description('register an SGLang server (or update it: registering is an upsert by url)')
      .argument('<url>', 'its base URL, e.g. http://10.0.0.5:30000')
      .option('--name <name>', 'a name to show')
      .option('--max-concurrency <n>', 'requests in flight at most (default: what the server reports)', positiveInt('--max-concurrency')),
  ).action((url, opts) => run(async () => (await import('./endpoints.js')).addEndpointCommand(url, opts)));
  sharing(
    client(endpoints.command('set'))
      .description('change an endpoint\'s sharing settings (README "Sharing servers"); `none` clears a setting')
      .argument('<endpoint>', 'its id'),
  ).action((id, opts) => run(async () => (await import('./endpoints.js')).setEndpointCommand(id, opts)));
  client(endpoints.command('list'))
    .description('endpoints with their state, load and stats')
    .action((opts) => run(async () => (await import('./endpoints.js')).listEndpointsCommand(opts)));

  const runs = program.command('runs').description('pause, resume or cancel a run');
  for (const [action, description] of [
    ['pause', 'stop dispatching; requests in flight finish'],
    ['resume', 'continue a paused run'],
    ['cancel', 'abort in-flight requests; completed samples are still written'],
  ] as const) {
    const cmd = client(runs.command(action)).description(description).argument('<run>', 'a run id');
    if (action === 'resume') cmd.option('--override-gate', 'keep the quality gate quiet for the rest of this run');
    cmd.action((runId, opts) => run(async () => (await import('./runs.js')).runActionCommand(action, runId, opts)));
  }
}
