// @ts-check
// The home page: every run with its progress, rate and ETA, and the endpoint pool; polled.
import { client, unwrap } from './api.js';
import { badge, fill, h, progressBar, route, table } from './dom.js';
import { answered, eta, num, pct, rate, runTitle, shownStatus, when } from './format.js';
import { endpointsTable } from './panels.js';
import { every } from './live.js';

/** Runs a page of the list shows. */
const PAGE_SIZE = 50;
/** @type {import('../client/schema.js').components['schemas']['RunStatus'][]} */
const STATUSES = ['validating', 'queued', 'in_progress', 'paused', 'finalizing', 'completed', 'failed', 'cancelling', 'cancelled'];

/** @param {HTMLElement} root */
export function runsView(root) {
  const runsEl = h('div', null, h('p', { className: 'muted' }, 'Loading runs…'));
  const endpointsEl = h('div', null);
  const errorEl = h('p', { className: 'error', hidden: true });
  // The list's filters and where its page starts: the cursors of the pages before, newest first.
  /** @type {string[]} */
  const cursors = [];
  const status = /** @type {HTMLSelectElement} */ (
    h(
      'select',
      { 'aria-label': 'status', onchange: () => restart() },
      h('option', { value: '' }, 'any status'),
      STATUSES.map((st) => h('option', { value: st }, st.replace('_', ' '))),
    )
  );
  const name = /** @type {HTMLInputElement} */ (h('input', { type: 'search', placeholder: 'name contains…', 'aria-label': 'name', oninput: () => restart() }));
  const newer = /** @type {HTMLButtonElement} */ (h('button', { type: 'button', onclick: () => turn(-1) }, '← Newer'));
  const older = /** @type {HTMLButtonElement} */ (h('button', { type: 'button', onclick: () => turn(1) }, 'Older →'));
  const pageEl = h('span', { className: 'small muted' });
  let lastId = '';
  fill(
    root,
    h('h1', null, 'Runs'),
    errorEl,
    h('section', { className: 'card' }, h('div', { className: 'filters' }, status, name, h('span', { className: 'spacer' }), pageEl, newer, older), runsEl),
    h('h2', null, 'Endpoints'),
    h('section', { className: 'card' }, endpointsEl),
  );

  async function load() {
    const query = {
      limit: PAGE_SIZE,
      ...(status.value && { status: /** @type {typeof STATUSES[number]} */ (status.value) }),
      ...(name.value.trim() && { name: name.value.trim() }),
      ...(cursors.length && { after: cursors[cursors.length - 1] }),
    };
    const [runs, endpoints] = await Promise.all([
      unwrap(client.GET('/v1/runs', { params: { query } })),
      unwrap(client.GET('/v1/endpoints', { params: { query: { limit: 100 } } })),
    ]);
    lastId = runs.last_id ?? '';
    newer.hidden = cursors.length === 0;
    older.hidden = !runs.has_more;
    fill(pageEl, cursors.length || runs.has_more ? `page ${cursors.length + 1}` : '');
    fill(runsEl, runsTable(runs.data, status.value !== '' || name.value.trim() !== ''));
    fill(endpointsEl, endpointsTable(endpoints.data));
  }
  function refresh() {
    load().catch((err) => {
      errorEl.hidden = false;
      errorEl.textContent = err.message;
    });
  }
  // A new filter starts from the newest page.
  function restart() {
    cursors.length = 0;
    refresh();
  }
  /** @param {1 | -1} step older or newer */
  function turn(step) {
    if (step > 0) cursors.push(lastId);
    else cursors.pop();
    refresh();
  }

  return every(2000, load, errorEl);
}

/**
 * @param {import('../client/schema.js').components['schemas']['Run'][]} runs
 * @param {boolean} filtered
 */
function runsTable(runs, filtered) {
  return table(
    [
      {
        label: 'Run',
        cell: (r) =>
          h(
            'div',
            null,
            h('a', { href: route('runs', r.id), className: 'run-link' }, runTitle(r)),
            h('div', { className: 'small muted' }, `${r.id} · ${r.model}`),
          ),
      },
      {
        label: 'Status',
        cell: (r) =>
          h(
            'div',
            null,
            badge(shownStatus(r)),
            r.dry_run ? h('span', { className: 'badge dry-run' }, 'dry run') : null,
            r.status_reason ? h('div', { className: 'small muted clip', title: r.status_reason }, r.status_reason) : null,
          ),
      },
      {
        label: 'Progress',
        className: 'progress-cell',
        cell: (r) => {
          const { fraction, label } = answered(r);
          return h('div', { title: label }, h('div', { className: 'pct' }, pct(fraction)), progressBar(fraction, shownStatus(r)));
        },
      },
      {
        label: 'Done / total',
        className: 'num',
        cell: (r) => `${num(answered(r).count)} / ${num(r.request_counts.total)}`,
      },
      { label: 'Rate', className: 'num', cell: (r) => `${rate(r.progress.samples_per_second)}/s` },
      { label: 'ETA', className: 'num', cell: (r) => eta(r) },
      {
        label: 'Flagged',
        className: 'num',
        cell: (r) => `${num(r.quality.flagged)}${r.request_counts.completed ? ` (${pct(r.quality.flagged / r.request_counts.completed)})` : ''}`,
      },
      { label: 'Shards', className: 'num', cell: (r) => `${num(r.shards.uploaded)} / ${num(r.shards.total)}` },
      { label: 'Created', cell: (r) => when(r.created_at) },
    ],
    runs,
    filtered ? 'No run matches these filters.' : 'No runs yet. Submit one with `regen submit prompts.jsonl --model M` or POST /v1/runs.',
  );
}
