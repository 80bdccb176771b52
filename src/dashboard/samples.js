// @ts-check
// A run's samples filtered by status or flag (page by page), and one sample: how it went, where its
// line is written, and its messages (conversation.js).
import { client, unwrap } from './api.js';
import { conversationView, requestView } from './conversation.js';
import { badge, fill, h, route, table } from './dom.js';
import { ms, num, when } from './format.js';

/** @typedef {import('../client/schema.js').components['schemas']} Schemas */

/**
 * @param {HTMLElement} root
 * @param {string} runId
 * @param {URLSearchParams} query
 */
export function samplesView(root, runId, query) {
  // As the page's address has them; the server refuses a status or flag it does not know.
  const status = /** @type {Schemas['SampleStatus'] | null} */ (query.get('status'));
  const flag = /** @type {Schemas['QualityFlag'] | null} */ (query.get('flag'));
  const filter = status ? { status } : flag ? { flag } : {};
  /** @type {Schemas['Sample'][]} */
  const rows = [];
  const list = h('div', null, h('p', { className: 'muted' }, 'Loading samples…'));
  const more = h('button', { type: 'button', hidden: true, onclick: () => load() }, 'Load more');
  const errorEl = h('p', { className: 'error', hidden: true });
  /** @type {string | null} */
  let after = null;
  fill(
    root,
    h('p', { className: 'crumbs' }, h('a', { href: '#/' }, 'Runs'), ' › ', h('a', { href: route('runs', runId) }, runId), ' › samples'),
    h('h1', null, 'Samples', status ? ` with status ${status}` : '', flag ? ` flagged ${flag}` : ''),
    errorEl,
    h('section', { className: 'card' }, list, more),
  );

  async function load() {
    try {
      const page = await unwrap(
        client.GET('/v1/runs/{id}/samples', { params: { path: { id: runId }, query: { limit: 100, ...filter, ...(after ? { after } : {}) } } }),
      );
      rows.push(...page.data);
      after = page.last_id;
      more.hidden = !page.has_more;
      fill(list, samplesTable(runId, rows));
    } catch (err) {
      errorEl.hidden = false;
      errorEl.textContent = /** @type {Error} */ (err).message;
    }
  }
  void load();
  return () => {};
}

/**
 * @param {string} runId
 * @param {Schemas['Sample'][]} rows
 */
function samplesTable(runId, rows) {
  /** @type {{ label: string, className?: string, cell: (s: Schemas['Sample']) => import('./dom.js').Child }[]} */
  const columns = [
    { label: 'Sample', cell: (s) => h('a', { href: route('runs', runId, 'samples', s.custom_id) }, s.custom_id) },
    { label: 'Status', cell: (s) => badge(s.status) },
  ];
  if (rows.some((s) => s.variant !== null)) columns.push({ label: 'Variant', cell: (s) => h('code', null, s.variant ?? '—') });
  // A conversation's requests answered so far: its turns and tool-call steps.
  if (rows.some((s) => s.turns_answered !== null)) columns.push({ label: 'Turns', className: 'num', cell: (s) => num(s.turns_answered) });
  columns.push(
    { label: 'Flags', cell: (s) => s.flags.map((f) => h('code', { className: 'flag' }, f)) },
    { label: 'Finish', cell: (s) => s.finish_reason ?? '—' },
    { label: 'Tokens', className: 'num', cell: (s) => (s.usage ? num(s.usage.completion_tokens) : '—') },
    { label: 'Latency', className: 'num', cell: (s) => ms(s.latency_ms) },
    { label: 'Attempts', className: 'num', cell: (s) => num(s.attempts) },
    { label: 'Error', cell: (s) => (s.error ? h('span', { className: 'small clip', title: s.error.message }, `${s.error.code}: ${s.error.message}`) : '') },
  );
  return table(columns, rows, 'No samples match.');
}

/**
 * @param {HTMLElement} root
 * @param {string} runId
 * @param {string} customId
 */
export function sampleView(root, runId, customId) {
  fill(root, h('p', { className: 'muted' }, 'Loading sample…'));
  // By query: a custom_id of `.` or `..` would be removed from a path by the URL parser.
  unwrap(client.GET('/v1/runs/{id}/sample', { params: { path: { id: runId }, query: { custom_id: customId } } }))
    .then((s) => {
      /**
       * @param {string} label
       * @param {import('./dom.js').Child} value
       */
      const meta = (label, value) => h('div', { className: 'stat' }, h('div', { className: 'label' }, label), h('div', { className: 'value small' }, value));
      fill(
        root,
        h('p', { className: 'crumbs' }, h('a', { href: '#/' }, 'Runs'), ' › ', h('a', { href: route('runs', runId) }, runId), ' › ', s.custom_id),
        h(
          'div',
          { className: 'title-row' },
          h('h1', null, s.custom_id),
          badge(s.status),
          s.flags.map((f) => h('code', { className: 'flag' }, f)),
        ),
        h(
          'section',
          { className: 'card stats' },
          meta('Finish reason', s.finish_reason ?? '—'),
          meta('Completion tokens', s.usage ? num(s.usage.completion_tokens) : '—'),
          meta('Reasoning tokens', s.usage ? num(s.usage.reasoning_tokens) : '—'),
          s.trainable_tokens == null ? null : meta('Trainable tokens', num(s.trainable_tokens)),
          meta('Latency', ms(s.latency_ms)),
          meta('Attempts', num(s.attempts)),
          meta('Endpoint', s.endpoint_id ?? '—'),
          meta('Variant', s.variant ?? '—'),
          meta('Split', s.split ?? '—'),
          meta('Shard', `${s.shard_key}${s.output_line ? ` (line ${num(s.output_line)})` : ''}`),
          meta('Done', when(s.completed_at)),
        ),
        s.error ? h('div', { className: 'banner warn' }, h('strong', null, s.error.code), ` ${s.error.status ?? ''} `, s.error.message) : null,
        s.metadata ? h('details', { open: true }, h('summary', null, 'Metadata'), h('pre', null, JSON.stringify(s.metadata, null, 2))) : null,
        s.conversation && s.turns ? [h('h2', null, `Conversation (${conversationSize(s.turns)})`), conversationView(s.conversation, s.turns)] : requestView(s),
        s.params ? h('details', null, h('summary', null, 'Per-sample params'), h('pre', null, JSON.stringify(s.params, null, 2))) : null,
      );
    })
    .catch((err) => fill(root, h('p', { className: 'error' }, err.status === 404 ? `There is no sample ${customId} in run ${runId}.` : err.message)));
  return () => {};
}

/** How many turns and tool-call steps a conversation's answered requests hold. */
function conversationSize(/** @type {Schemas['SampleTurn'][]} */ turns) {
  const steps = turns.filter((t) => t.tool_calls).length;
  const replies = turns.length - steps;
  return `${num(replies)} ${replies === 1 ? 'reply' : 'replies'}${steps > 0 ? `, ${num(steps)} tool-call ${steps === 1 ? 'step' : 'steps'}` : ''}`;
}
