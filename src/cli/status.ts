import type { components } from '../client/index.js';
import { Client, type ClientOptions } from './client.js';
import { answersPerLine, requestUnit, unitOf } from '../dashboard/format.js';
import { answered, duration, num, pct, rate, runStatus, table, TERMINAL, WAITING, warnColour, warned } from './format.js';
import { watchRun } from './watch.js';

type Run = components['schemas']['Run'];
type Shard = components['schemas']['Shard'];

/** Shards a page of the list holds: the largest the API gives. */
const SHARDS_PAGE = 1000;

const eta = (r: Run) =>
  TERMINAL.includes(r.status) ? 'done' : r.status === 'paused' ? 'paused' : r.progress.eta_seconds == null ? '-' : duration(r.progress.eta_seconds);
const flagged = (r: Run) => `${num(r.quality.flagged)}${r.request_counts.completed ? ` (${pct(r.quality.flagged / r.request_counts.completed)})` : ''}`;

function runsTable(runs: Run[]): string {
  if (!runs.length) return 'no runs yet; submit one with `regen submit prompts.jsonl --model M`';
  return table(
    // The reason goes last: it is long, and shown only for a run that waits (queued, paused).
    ['RUN', 'NAME', 'STATUS', 'PROGRESS', 'DONE/TOTAL', 'RATE', 'ETA', 'FLAGGED', 'CREATED', 'REASON'],
    runs.map((r) => [
      r.id,
      r.name ?? '-',
      r.dry_run ? `${r.status} (dry run)` : runStatus(r),
      pct(answered(r).fraction),
      `${num(answered(r).count)}/${num(r.request_counts.total)}`,
      // A conversation run's rate counts conversations: each rate names its unit.
      `${rate(r.progress.samples_per_second)} ${unitOf(r)}/s`,
      eta(r),
      flagged(r),
      r.created_at.slice(0, 19).replace('T', ' '),
      WAITING.includes(r.status) ? (r.status_reason ?? '') : '',
    ]),
    [3, 4, 5, 6],
  );
}

/** The status with its reason; a completed run's warnings (the reason again when the gate is on) in the warning colour. */
function statusLine(r: Run): string {
  const reason = r.status_reason ?? r.warnings?.map((w) => w.message).join('; ');
  const line = runStatus(r) + (reason ? `: ${reason}` : '');
  return warned(r) ? warnColour(line, process.stdout) : line;
}

function runDetail(r: Run, shards: readonly Shard[] = []): string {
  const c = r.request_counts;
  const completed = c.completed;
  const flags = Object.entries(r.quality.by_flag)
    .filter(([, n]) => n > 0)
    .map(([f, n]) => `${f} ${num(n)} (${pct(n / completed)})`);
  const unit = unitOf(r);
  const n = answersPerLine(r);
  const claimed = Math.max(0, c.in_progress - r.progress.samples_in_flight);
  const rows: [string, string][] = [
    ['run', `${r.id}${r.name ? ` (${r.name})` : ''}${r.dry_run ? ', a dry run: its calibration slice only, for the forecast' : ''}`],
    ['model', r.model],
    ['status', statusLine(r)],
    ['setup', setupLine(r)],
    ['progress', `${pct(answered(r).fraction)}, ${answered(r).label}`],
    [
      unit,
      `${num(c.completed)} completed, ${num(c.failed)} failed, ${num(claimed)} claimed ahead, ${num(c.pending)} pending${c.cancelled ? `, ${num(c.cancelled)} cancelled` : ''}`,
    ],
    ['in flight', `${num(r.progress.in_flight)} ${requestUnit(r)}${n > 1 ? ` (${num(r.progress.samples_in_flight)} samples, n = ${n})` : ''}`],
    ...(r.turns
      ? ([
          [
            'turns',
            `${num(r.turns.completed)} of ${num(r.turns.total)} answered, ${num(r.turns.in_flight)} in flight, ${num(r.turns.failed)} failed${r.turns.tool_steps ? `, ${num(r.turns.tool_steps)} tool-call steps` : ''}`,
          ],
        ] as [string, string][])
      : []),
    [
      'rate',
      `${rate(r.progress.samples_per_second)} ${unit}/s, ${r.turns ? `${rate(r.progress.turns_per_second ?? 0)} turns/s, ` : ''}${n > 1 ? `${rate(r.progress.requests_per_second ?? 0)} requests/s, ` : ''}${rate(r.progress.completion_tokens_per_second)} completion tokens/s`,
    ],
    ['eta', `${eta(r)} (elapsed ${duration(r.progress.elapsed_seconds)})`],
    ['quality', `${flagged(r)} flagged${flags.length ? `: ${flags.join(', ')}` : ''}`],
    ['tokens', `${num(r.usage.prompt_tokens)} prompt, ${num(r.usage.completion_tokens)} completion (${num(r.usage.reasoning_tokens)} reasoning)`],
    ['cache', cacheLine(r)],
    ['shards', `${num(r.shards.uploaded)} of ${num(r.shards.total)} uploaded, ${num(r.shard_size)} ${unit} each${splitLine(shards, unit)}`],
    ['params', JSON.stringify(r.params)],
    ['output', r.output_uri],
    ['created', r.created_at + (r.started_at ? `, started ${r.started_at}` : '') + (r.finished_at ? `, finished ${r.finished_at}` : '')],
  ];
  if (r.card_uri) rows.push(['card', r.card_uri]);
  if (r.manifest_uri) rows.push(['manifest', r.manifest_uri]);
  if (r.output_tokens) rows.push(['trainable', trainableLine(r.num_trainable ?? null)]);
  if (r.progress.without_ids.length)
    rows.push(['without ids', `not sent to ${r.progress.without_ids.map((e) => `${e.name} (${e.endpoint_id}): ${e.reason}`).join('; ')}`]);
  if (r.invalid_lines.count)
    rows.push(['invalid lines', `${num(r.invalid_lines.count)}; first: line ${r.invalid_lines.errors[0]?.line}: ${r.invalid_lines.errors[0]?.message}`]);
  if (r.on_length !== 'keep')
    rows.push(['on length', `${r.on_length} (an answer cut by max_tokens is ${r.on_length === 'retry' ? 'asked again with more room' : 'failed'})`]);
  const width = Math.max(...rows.map(([k]) => k.length));
  const detail = rows.map(([k, v]) => `${k.padEnd(width)}  ${v}`).join('\n');
  return r.variants ? `${detail}\n\n${variantsTable(r.variants)}` : detail;
}

/**
 * A split run's shards by split, as the page's shards card says it: "; train 3 shards, 2 uploaded,
 * 120 of 300 conversations done · eval …"; empty without a split.
 */
function splitLine(shards: readonly Shard[], unit: string): string {
  const parts = (['train', 'eval'] as const).flatMap((split) => {
    const of = shards.filter((s) => s.split === split);
    if (!of.length) return [];
    const uploaded = of.filter((s) => s.status === 'uploaded').length;
    const done = of.reduce((t, s) => t + s.done, 0);
    const samples = of.reduce((t, s) => t + s.samples, 0);
    return [`${split} ${num(of.length)} shards, ${num(uploaded)} uploaded, ${num(done)} of ${num(samples)} ${unit} done`];
  });
  return parts.length ? `; ${parts.join(' · ')}` : '';
}

/** A split run's shards, every page of them; none for a run without a split (its breakdown would be empty). */
async function splitShards(client: Client, r: Run): Promise<Shard[]> {
  if (!r.split) return [];
  const shards: Shard[] = [];
  let after: string | undefined;
  for (;;) {
    const page = await client.get('/v1/runs/{id}/shards', { params: { path: { id: r.id }, query: { limit: SHARDS_PAGE, ...(after && { after }) } } });
    shards.push(...page.data);
    if (!page.has_more || page.last_id === null) return shards;
    after = page.last_id;
  }
}

/** How the run is set up, as the page's progress card says it: what it regenerates, answers a line, split, format, card. */
function setupLine(r: Run): string {
  return [
    `regenerate ${r.regenerate ?? 'none (prompts answered as given)'}`,
    `n ${answersPerLine(r)}`,
    `split ${r.split ? `${pct(r.split.eval, 0)} eval, the rest train` : 'none'}`,
    `format ${r.output_format}`,
    `card ${r.card_uri ? 'README.md beside the shards' : 'none'}`,
  ].join(', ');
}

/** The share of prompt tokens served from the servers' prefix caches, then by endpoint (named as the endpoints list names them). */
function cacheLine(r: Run): string {
  if (r.cache_hit_rate == null) return 'no prompt tokens answered yet';
  const by = (r.cache_by_endpoint ?? []).map((e) => `${e.endpoint_name ?? e.endpoint_id} ${e.cache_hit_rate == null ? '-' : pct(e.cache_hit_rate)}`);
  return `${pct(r.cache_hit_rate)} of prompt tokens from prefix caches${by.length ? ` (${by.join(', ')})` : ''}`;
}

/** The training rows' trainable tokens, overall then per variant: "min 3, p5 6, median 6, p95 210, max 480 over 1,200 rows; think: …". */
function trainableLine(spread: Run['num_trainable'] | null): string {
  const one = (s: NonNullable<Run['num_trainable']>['overall']) =>
    s ? `min ${num(s.min)}, p5 ${num(s.p5)}, median ${num(s.median)}, p95 ${num(s.p95)}, max ${num(s.max)} over ${num(s.rows)} rows` : 'no rows written yet';
  if (!spread) return 'no rows written yet';
  return [one(spread.overall), ...Object.entries(spread.variants).map(([name, s]) => `${name}: ${one(s)}`)].join('; ');
}

/** A run's variants, one row each: its share, how far it is, its flags and its tokens. */
function variantsTable(variants: NonNullable<Run['variants']>): string {
  const weights = variants.reduce((t, v) => t + v.weight, 0);
  return table(
    ['VARIANT', 'WEIGHT', 'DONE/TOTAL', 'FAILED', 'FLAGGED', 'TOP FLAG', 'COMPLETION TOKENS', 'REASONING', 'CACHE'],
    variants.map((v) => {
      const c = v.request_counts;
      const top = Object.entries(v.quality.by_flag).sort((a, b) => b[1] - a[1])[0];
      return [
        v.name,
        `${num(v.weight)} (${pct(v.weight / weights)})`,
        `${num(c.completed + c.failed)}/${num(c.total)}`,
        num(c.failed),
        `${num(v.quality.flagged)}${c.completed ? ` (${pct(v.quality.flagged / c.completed)})` : ''}`,
        top && top[1] > 0 ? `${top[0]} ${num(top[1])}` : '-',
        num(v.usage.completion_tokens),
        num(v.usage.reasoning_tokens),
        v.cache_hit_rate == null ? '-' : pct(v.cache_hit_rate),
      ];
    }),
    [1, 2, 3, 4, 6, 7, 8],
  );
}

/** `regen status`: a table of runs; `regen status RUN`: one run in detail (and followed, with --watch). */
export async function statusCommand(runId: string | undefined, opts: ClientOptions & { watch?: boolean }): Promise<number> {
  const client = new Client(opts);
  if (!runId) {
    const runs = await client.get('/v1/runs', { params: { query: { limit: 100 } } });
    process.stdout.write(runsTable(runs.data) + '\n');
    return 0;
  }
  const run = await client.get('/v1/runs/{id}', { params: { path: { id: runId } } });
  process.stdout.write(runDetail(run, await splitShards(client, run)) + '\n');
  return opts.watch ? watchRun(client, run.id) : 0;
}
