// @ts-check
// A run's progress card: how far it is, how fast, what is in flight, and how it is set up. Each
// figure names its unit: a conversation run counts conversations, its requests are its turns; a run
// asking n > 1 answers a line counts samples, n of them a request.
import { h, progressBar } from './dom.js';
import { answered, answersPerLine, at, duration, eta, num, pct, rate, requestUnit, shownStatus, TERMINAL, unitOf } from './format.js';

/** @typedef {import('../client/schema.js').components['schemas']} Schemas */

/**
 * @param {string} label
 * @param {import('./dom.js').Child} value
 * @param {import('./dom.js').Child} [extra]
 */
const stat = (label, value, extra) =>
  h(
    'div',
    { className: 'stat' },
    h('div', { className: 'label' }, label),
    h('div', { className: 'value' }, value),
    extra ? h('div', { className: 'small muted' }, extra) : null,
  );

/**
 * The progress card's content.
 * @param {Schemas['Run']} run
 */
export function progressCard(run) {
  const c = run.request_counts;
  const p = run.progress;
  const shown = answered(run);
  const finished = TERMINAL.includes(run.status);
  const unit = unitOf(run);
  const n = answersPerLine(run);
  const requests = requestUnit(run);
  return [
    h('div', { className: 'progress-line' }, h('span', { className: 'big-pct' }, pct(shown.fraction)), h('span', { className: 'muted' }, shown.label)),
    progressBar(shown.fraction, shownStatus(run)),
    h(
      'div',
      { className: 'stats' },
      stat(
        finished ? 'Average rate' : 'Rate',
        // The unit in a smaller type: "conversations/s" beside the figure fits a 1024 px page's column.
        [rate(p.samples_per_second), h('span', { className: 'unit' }, ` ${unit}/s`)],
        [
          run.turns ? `${rate(p.turns_per_second)} turns/s · ` : '',
          n > 1 ? `${rate(p.requests_per_second ?? 0)} requests/s · ` : '',
          `${rate(p.completion_tokens_per_second)} tokens/s`,
        ].join(''),
      ),
      finished
        ? stat('Took', duration(p.elapsed_seconds), run.finished_at ? `ended ${at(run.finished_at)}` : '')
        : stat('ETA', eta(run), `elapsed ${duration(p.elapsed_seconds)}`),
      stat(`Completed ${unit}`, num(c.completed)),
      stat(`Failed ${unit}`, num(c.failed)),
      // Requests sent and not answered, in the unit the endpoints count; the samples they answer
      // when a request asks for n of them; the samples claimed ahead of dispatch (also in_progress) apart.
      stat(
        `In flight (${requests})`,
        num(p.in_flight),
        [
          n > 1 ? `${num(p.samples_in_flight)} samples (n = ${n}) · ` : '',
          `${num(Math.max(0, c.in_progress - p.samples_in_flight))} ${unit} claimed ahead · ${num(c.pending)} pending`,
        ].join(''),
      ),
      // Turned away for a while by endpoints busy with other traffic: asked again, nothing charged.
      p.turned_away ? stat('Turned away', num(p.turned_away), 'by endpoints busy with other traffic; no attempt charged') : null,
      // A run writing token ids is not sent to endpoints that return none; they serve other runs.
      p.without_ids?.length
        ? stat('Without token ids', p.without_ids.map((e) => e.name).join(', '), p.without_ids.map((e) => `${e.name}: ${e.reason}`).join(' · '))
        : null,
      run.turns
        ? stat(
            'Turns answered',
            `${num(run.turns.completed)} / ${num(run.turns.total)}`,
            `${num(run.turns.in_flight)} in flight · ${num(run.turns.failed)} failed${run.turns.tool_steps ? ` · ${num(run.turns.tool_steps)} tool-call steps` : ''}`,
          )
        : null,
      stat('Tokens', num(run.usage.completion_tokens), `${num(run.usage.reasoning_tokens)} reasoning · ${num(run.usage.prompt_tokens)} prompt`),
      stat('Prefix cache', run.cache_hit_rate == null ? '—' : pct(run.cache_hit_rate), cacheByEndpoint(run)),
      run.num_trainable?.overall
        ? stat(
            'Trainable tokens',
            `median ${num(run.num_trainable.overall.median)}`,
            `min ${num(run.num_trainable.overall.min)} · p5 ${num(run.num_trainable.overall.p5)} · p95 ${num(run.num_trainable.overall.p95)} · max ${num(run.num_trainable.overall.max)} over ${num(run.num_trainable.overall.rows)} rows`,
          )
        : null,
    ),
    h('div', { className: 'small muted output settings' }, settings(run)),
    h(
      'div',
      { className: 'small muted output' },
      'Output: ',
      h('code', null, run.output_uri),
      run.manifest_uri ? [' · manifest ', h('code', null, run.manifest_uri)] : null,
      run.card_uri ? [' · card ', h('code', null, run.card_uri)] : null,
    ),
  ];
}

/**
 * How the run is set up, in the words of its request: what it regenerates, answers a line, split, format.
 * @param {Schemas['Run']} run
 */
export function settings(run) {
  /** @type {[string, string][]} */
  const parts = [
    ['regenerate', run.regenerate ?? 'none (prompts answered as given)'],
    ['n', String(answersPerLine(run))],
    ['split', run.split ? `${pct(run.split.eval, 0)} eval, the rest train` : 'none'],
    ['format', run.output_format],
    ['card', run.card_uri ? 'README.md beside the shards' : 'none'],
  ];
  return parts.flatMap(([k, v], i) => [i ? ' · ' : '', `${k} `, h('code', { className: `setting-${k}` }, v)]);
}

/**
 * The prompt tokens served from the servers' prefix caches, by endpoint (GET of one run only), each
 * named as the endpoints table names it; an endpoint deleted since shows its id.
 * @param {Schemas['Run']} run
 */
function cacheByEndpoint(run) {
  const by = run.cache_by_endpoint ?? [];
  if (!by.length) return 'of prompt tokens (cached_tokens)';
  return by.map((e) => `${e.endpoint_name ?? e.endpoint_id} ${e.cache_hit_rate == null ? '—' : pct(e.cache_hit_rate)}`).join(' · ');
}
