// @ts-check
// The home page: every run with its progress, rate and ETA, and the endpoint pool; polled.
import { client, unwrap } from './api.js';
import { badge, fill, h, progressBar, route, table } from './dom.js';
import { answered, eta, num, pct, rate, runTitle, when } from './format.js';
import { endpointsTable } from './panels.js';
import { every } from './live.js';

/** @param {HTMLElement} root */
export function runsView(root) {
  const runsEl = h('div', null, h('p', { className: 'muted' }, 'Loading runs…'));
  const endpointsEl = h('div', null);
  const errorEl = h('p', { className: 'error', hidden: true });
  fill(
    root,
    h('h1', null, 'Runs'),
    errorEl,
    h('section', { className: 'card' }, runsEl),
    h('h2', null, 'Endpoints'),
    h('section', { className: 'card' }, endpointsEl),
  );

  return every(
    2000,
    async () => {
      const [runs, endpoints] = await Promise.all([
        unwrap(client.GET('/v1/runs', { params: { query: { limit: 100 } } })),
        unwrap(client.GET('/v1/endpoints', { params: { query: { limit: 100 } } })),
      ]);
      fill(runsEl, runsTable(runs.data));
      fill(endpointsEl, endpointsTable(endpoints.data));
    },
    errorEl,
  );
}

/** @param {import('../client/schema.js').components['schemas']['Run'][]} runs */
function runsTable(runs) {
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
            badge(r.status),
            r.dry_run ? h('span', { className: 'badge dry-run' }, 'dry run') : null,
            r.status_reason ? h('div', { className: 'small muted clip', title: r.status_reason }, r.status_reason) : null,
          ),
      },
      {
        label: 'Progress',
        className: 'progress-cell',
        cell: (r) => {
          const { fraction, label } = answered(r);
          return h('div', { title: label }, h('div', { className: 'pct' }, pct(fraction)), progressBar(fraction, r.status));
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
    'No runs yet. Submit one with `regen submit prompts.jsonl --model M` or POST /v1/runs.',
  );
}
