// @ts-check
// The pieces of the run page (and the endpoints table the runs list shares), each a function from
// API objects to nodes.
import { badge, h, progressBar, route, table } from './dom.js';
import { at, duration, ms, num, pct, rate, when } from './format.js';

/** @typedef {import('../client/schema.js').components['schemas']} Schemas */

// The flags come from the server (every run carries each one's count); a flag added there without
// its words here fails tsc, as the map is typed from the generated schema.
/** @type {Record<Schemas['QualityFlag'], string>} */
const FLAG_HELP = {
  empty_content: 'content is blank',
  missing_reasoning: 'thinking was asked for but reasoning is empty',
  truncated: 'stopped by max_tokens (finish_reason length)',
  repetitive: 'the tail repeats one short span',
  too_short: 'fewer completion tokens than the run’s minimum',
  duplicate_content: 'the same answer as many other samples of the run',
  think_in_content: 'thinking inside content: the server lacks --reasoning-parser',
  short_for_run: 'far below the run’s own median length',
  tool_call_in_content: 'tool calls written inside content: the server lacks --tool-call-parser',
  invalid_tool_arguments: 'a tool call’s arguments are not a JSON object',
  unknown_tool: 'a tool call names a function the line does not offer',
  tool_mismatch: 'the source’s tool results could not be paired with the calls (not judged by the gate)',
  few_trainable: 'fewer generated token ids than quality.min_trainable_tokens: a loss mask that trains on almost nothing (output.tokens)',
};

/** What each source of an endpoint's cap means, for the cell's tooltip. */
/** @type {Record<Schemas['Endpoint']['max_concurrency_source'], string>} */
const CAP_SOURCES = {
  user: "the operator's max_concurrency",
  adaptive: "steered from the server's live load (KV usage, queue, retractions)",
  server: "the server's own running limit",
  default: 'REGEN_DEFAULT_CONCURRENCY: the server says neither its limit nor its load',
};

/**
 * How old a load reading may be and still be shown as the server's load now: a few of the runner's
 * readings (REGEN_LOAD_INTERVAL_MS, 1 s by default), so one slow answer does not grey it.
 */
const FRESH_LOAD_MS = 10_000;

/**
 * Load figures that no longer describe the server: it failed its last probe, is not ready, or has
 * not been read for a while.
 * @param {Schemas['Endpoint']} e
 */
function staleLoad(e) {
  const readAt = e.server.read_at ? Date.parse(e.server.read_at) : 0;
  return e.state !== 'ready' || e.last_error !== null || Date.now() - readAt > FRESH_LOAD_MS;
}

/**
 * The endpoints; on a run's page, with `quality` (its quality report), each one's flagged share of the run's recent samples.
 * @param {Schemas['Endpoint'][]} endpoints
 * @param {string} [model] the run's: endpoints serving another model are greyed
 * @param {Schemas['RunQuality'] | null} [quality]
 */
export function endpointsTable(endpoints, model, quality = null) {
  const shares = new Map((quality?.endpoints ?? []).map((q) => [q.endpoint_id, q]));
  const rows = [...endpoints].sort((a, b) => Number(b.model === model) - Number(a.model === model));
  const el = table(
    [
      {
        label: 'Endpoint',
        cell: (e) =>
          h(
            'div',
            { className: model && e.model && e.model !== model ? 'muted' : null },
            h('strong', null, e.name),
            h('div', { className: 'small muted' }, e.url),
          ),
      },
      { label: 'Model', cell: (e) => e.model ?? '—' },
      {
        label: 'State',
        cell: (e) =>
          h(
            'div',
            null,
            badge(e.state),
            // Lent by night or past its lend: regen sends nothing new until its next window.
            e.off_schedule ? h('div', { className: 'small muted' }, e.next_window_at ? `off schedule until ${at(e.next_window_at)}` : 'off schedule') : null,
            e.last_error ? h('div', { className: 'small error clip narrow', title: e.last_error }, e.last_error) : null,
          ),
      },
      {
        label: 'In flight / cap',
        className: 'num',
        cell: (e) =>
          h(
            'div',
            null,
            `${num(e.in_flight)} / ${num(e.max_concurrency)}`,
            // Under the figures, as the server load's details are: on their line they widened the table past a 1024 px card.
            h('div', { className: 'small muted', title: CAP_SOURCES[e.max_concurrency_source] ?? '' }, e.max_concurrency_source),
            progressBar(e.max_concurrency ? e.in_flight / e.max_concurrency : 0, 'mini'),
          ),
      },
      // An endpoint counts requests (a sample's, a conversation's turn, a line's n answers at once), over all runs;
      // its tokens under them, in one column: a second one widened the table past a 1024 px card.
      {
        label: 'Requests/s',
        title: 'requests answered a second over the last minute, all runs: a conversation’s turn, or a line’s one request for its n answers',
        className: 'num',
        cell: (e) =>
          h('div', null, rate(e.stats.samples_per_second), h('div', { className: 'small muted' }, `${rate(e.stats.completion_tokens_per_second)} tokens/s`)),
      },
      { label: 'p50', className: 'num', cell: (e) => ms(e.stats.p50_latency_ms) },
      {
        label: 'Server load',
        className: 'num',
        cell: (e) => {
          if (e.server.running == null && e.server.queued == null) return '—';
          const stale = staleLoad(e);
          return h(
            'div',
            {
              className: stale ? 'stale' : null,
              title: stale ? 'the server’s last known load (running / queued): it has not answered since' : 'requests running / queued on the server',
            },
            `${num(e.server.running)} / ${num(e.server.queued)}`,
            e.server.token_usage == null ? null : h('div', { className: 'small muted' }, `KV ${Math.round(e.server.token_usage * 100)}%`),
            e.server.cache_hit_rate == null ? null : h('div', { className: 'small muted' }, `cache hits ${pct(e.server.cache_hit_rate)}`),
            stale && e.server.read_at
              ? h(
                  'div',
                  { className: 'small last-seen', title: e.server.read_at },
                  `last seen ${duration((Date.now() - Date.parse(e.server.read_at)) / 1000)} ago`,
                )
              : null,
          );
        },
      },
      {
        label: 'Answers done / failed (all runs)',
        title: 'answers this endpoint gave and failed over every run: a conversation’s turns, each of a line’s n answers',
        className: 'num',
        cell: (e) => `${num(e.stats.completed)} / ${num(e.stats.failed)}`,
      },
      ...(quality
        ? [
            {
              label: 'Flagged (run)',
              className: 'num',
              /** @param {Schemas['Endpoint']} e */
              cell: (e) => {
                const q = shares.get(e.id);
                if (!q) return '—';
                return h(
                  'div',
                  { title: `of its ${q.samples} answers among the run's last samples: what the quarantine judges` },
                  pct(q.share),
                  q.top_flag ? h('div', { className: 'small muted' }, q.top_flag) : null,
                );
              },
            },
          ]
        : []),
    ],
    rows,
    'No endpoints registered. Add one with `regen endpoints add URL` or POST /v1/endpoints.',
  );
  el.classList.add('endpoints');
  return el;
}

/** A shard's state on the page: written and listed in the manifest, every sample done and being written, some done, none done. */
const SHARD_STATES = /** @type {const} */ ([
  ['uploaded', 'uploaded'],
  ['writing', 'writing'],
  ['partial', 'in progress'],
  ['open', 'waiting'],
]);
/** Shards listed by name under the grid: enough to act on, not a second copy of it. */
const SHARDS_LISTED = 10;

/** @param {Schemas['Shard']} s */
const shardState = (s) => (s.status === 'uploaded' ? 'uploaded' : s.done >= s.samples ? 'writing' : s.done > 0 ? 'partial' : 'open');

/**
 * The shards in little room: one line counting them by state (its swatches the legend), a grid of
 * small cells whose titles tell each shard, and by name the shards that need a look: those whose
 * upload failed, and once the run has ended those never written.
 * @param {Schemas['Shard'][]} shards
 * @param {number} total
 * @param {boolean} ended
 * @param {string} unit what the run's samples are: samples, or a conversation run's conversations
 */
export function shardGrid(shards, total, ended, unit) {
  /** @type {Record<string, number>} */
  const counts = { uploaded: 0, writing: 0, partial: 0, open: 0 };
  const cells = shards.map((s) => {
    const state = shardState(s);
    counts[state]++;
    const cell = h('span', {
      className: `shard ${state}${s.last_error ? ' failing' : ''}`,
      title: `shard ${s.index}: ${s.done}/${s.samples} done${s.status === 'uploaded' ? `, uploaded (${num(s.lines)} lines)` : ''}${s.last_error ? `, last error: ${s.last_error}` : ''}`,
    });
    if (state === 'partial') cell.style.setProperty('--done', `${Math.round((100 * s.done) / s.samples)}%`);
    return cell;
  });
  const attention = shards.filter((s) => s.last_error || (ended && s.status !== 'uploaded'));
  return h(
    'div',
    null,
    splitBreakdown(shards, unit),
    h(
      'div',
      { className: 'legend small shard-summary' },
      SHARD_STATES.map(([state, label]) =>
        h('span', { className: 'shard-count' }, h('span', { className: `shard ${state}` }), ` ${num(counts[state])} ${label}`),
      ),
      total > shards.length ? h('span', { className: 'muted' }, ` · the first ${num(shards.length)} of ${num(total)} shown`) : null,
    ),
    h('div', { className: 'shard-grid' }, cells),
    attention.length
      ? h(
          'ul',
          { className: 'shard-attention small' },
          attention
            .slice(0, SHARDS_LISTED)
            .map((s) =>
              h(
                'li',
                null,
                h('strong', null, `shard ${s.index}`),
                ` · ${num(s.done)}/${num(s.samples)} done · `,
                s.last_error
                  ? h('span', { className: 'error' }, `upload failed ${num(s.upload_attempts)}×: ${s.last_error}`)
                  : h('span', { className: 'muted' }, 'not written'),
              ),
            ),
          attention.length > SHARDS_LISTED ? h('li', { className: 'muted' }, `and ${num(attention.length - SHARDS_LISTED)} more`) : null,
        )
      : null,
  );
}

/**
 * A split run's shards by split: how many, how many uploaded, their samples done; null without a split.
 * @param {Schemas['Shard'][]} shards
 * @param {string} unit
 */
function splitBreakdown(shards, unit) {
  const splits = /** @type {const} */ (['train', 'eval']).map((split) => ({ split, of: shards.filter((s) => s.split === split) }));
  if (splits.every((s) => !s.of.length)) return null;
  return h(
    'div',
    { className: 'small shard-splits' },
    splits.map(({ split, of }, i) => {
      const uploaded = of.filter((s) => s.status === 'uploaded').length;
      const done = of.reduce((t, s) => t + s.done, 0);
      const samples = of.reduce((t, s) => t + s.samples, 0);
      return h(
        'span',
        { className: `shard-split split-${split}` },
        i ? ' · ' : '',
        h('strong', null, split),
        ` ${num(of.length)} shards, ${num(uploaded)} uploaded, ${num(done)} of ${num(samples)} ${unit} done`,
      );
    }),
  );
}

/** @param {Schemas['RunQuality']} quality */
export function gateText(quality) {
  const { settings, gate } = quality;
  const rule = settings && settings.gate;
  if (!gate.enabled || !rule) return 'gate off';
  const limit = `gate: pause above ${pct(rule.max_flag_rate, 0)} flagged after ${num(rule.min_samples)} samples`;
  return gate.overridden ? `${limit} (overridden)` : limit;
}

/**
 * The flag table: counts, shares of completed samples, and links to samples carrying each flag.
 * @param {Schemas['Run']} run
 * @param {Schemas['RunQuality'] | null} quality
 */
export function qualityTable(run, quality) {
  const completed = run.request_counts.completed;
  // A flag alone above the gate's limit would trip it: that is the share worth showing in red.
  const rule = quality?.settings && quality.settings.gate;
  const limit = rule ? rule.max_flag_rate : 0.2;
  // The flags that occurred get rows; the others fold into one line that opens to their meanings.
  const flags = /** @type {Schemas['QualityFlag'][]} */ (Object.keys(run.quality.by_flag));
  const seen = flags.filter((f) => run.quality.by_flag[f] > 0);
  const unseen = flags.filter((f) => run.quality.by_flag[f] === 0);
  const rest = unseen.length
    ? h(
        'details',
        { className: 'quality-rest small' },
        h(
          'summary',
          { className: 'muted' },
          `${seen.length ? 'No sample' : 'No completed sample'} has ${unseen.length === flags.length ? 'any of the' : 'the other'} ${unseen.length} flags`,
        ),
        h(
          'ul',
          null,
          unseen.map((f) => h('li', null, h('code', null, f), ` ${FLAG_HELP[f]}`)),
        ),
      )
    : null;
  const rows = table(
    [
      { label: 'Flag', cell: (f) => h('div', null, h('code', null, f), h('div', { className: 'small muted' }, FLAG_HELP[f])) },
      { label: 'Samples', className: 'num', cell: (f) => num(run.quality.by_flag[f]) },
      {
        label: 'Share',
        className: 'num',
        cell: (f) => {
          const share = completed ? run.quality.by_flag[f] / completed : 0;
          return h('div', null, pct(share), progressBar(share, share > limit ? 'bad' : 'mini'));
        },
      },
      {
        label: 'Examples',
        cell: (f) =>
          run.quality.by_flag[f] === 0
            ? h('span', { className: 'muted' }, '—')
            : h(
                'div',
                { className: 'examples' },
                (quality?.by_flag[f].examples ?? []).slice(0, 3).map((id) => h('a', { href: route('runs', run.id, 'samples', id) }, id)),
                h('a', { href: `${route('runs', run.id, 'samples')}?flag=${encodeURIComponent(f)}`, className: 'more' }, 'all →'),
              ),
      },
    ],
    seen,
    '',
  );
  return h('div', null, rows, rest);
}

/**
 * @param {Schemas['Run']} run
 * @param {Schemas['Sample'][]} failures
 */
export function failuresList(run, failures) {
  return table(
    [
      { label: 'Sample', cell: (s) => h('a', { href: route('runs', run.id, 'samples', s.custom_id) }, s.custom_id) },
      {
        label: 'Error',
        cell: (s) =>
          h('div', null, h('code', null, s.error?.code ?? '—'), h('div', { className: 'small clip', title: s.error?.message ?? '' }, s.error?.message ?? '')),
      },
      { label: 'Attempts', className: 'num', cell: (s) => num(s.attempts) },
      { label: 'When', cell: (s) => when(s.completed_at) },
    ],
    failures,
    'No failed samples.',
  );
}

/**
 * A run's variants, one row each: its weight and share, how far it is, its flags (the commonest
 * named) and its tokens.
 * @param {NonNullable<Schemas['Run']['variants']>} variants
 */
export function variantsTable(variants) {
  const weights = variants.reduce((t, v) => t + v.weight, 0);
  /** @param {Schemas['RunVariant']} v */
  const topFlag = (v) => {
    const [flag, n] = Object.entries(v.quality.by_flag).sort((a, b) => b[1] - a[1])[0] ?? ['', 0];
    return n > 0 ? h('span', null, h('code', null, flag), ` ${num(n)}`) : h('span', { className: 'muted' }, '—');
  };
  return table(
    [
      { label: 'Variant', cell: (v) => h('code', null, v.name) },
      { label: 'Weight', className: 'num', cell: (v) => `${num(v.weight)} (${pct(v.weight / weights)})` },
      {
        label: 'Done',
        className: 'num',
        cell: (v) => {
          const c = v.request_counts;
          const share = c.total ? (c.completed + c.failed) / c.total : 0;
          return h('div', null, `${num(c.completed + c.failed)} / ${num(c.total)}`, progressBar(share, 'mini'));
        },
      },
      { label: 'Failed', className: 'num', cell: (v) => num(v.request_counts.failed) },
      {
        label: 'Flagged',
        className: 'num',
        cell: (v) => `${num(v.quality.flagged)}${v.request_counts.completed ? ` (${pct(v.quality.flagged / v.request_counts.completed)})` : ''}`,
      },
      { label: 'Top flag', cell: topFlag },
      { label: 'Completion tokens', className: 'num', cell: (v) => num(v.usage.completion_tokens) },
      { label: 'Reasoning', className: 'num', cell: (v) => num(v.usage.reasoning_tokens) },
      // Prompt tokens from the prefix cache: a variant whose params change the prompt (a system prompt, thinking) reuses less.
      { label: 'Prefix cache', className: 'num', cell: (v) => (v.cache_hit_rate == null ? '—' : pct(v.cache_hit_rate)) },
    ],
    variants,
    '',
  );
}
