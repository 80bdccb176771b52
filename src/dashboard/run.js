// @ts-check
// One run: live progress from its event stream, throughput over time, shards, the endpoint pool,
// quality flags with example samples, failures, and the pause / resume / cancel buttons.
import { client, unwrap } from './api.js';
import { drawForecast, drawThroughput } from './chart.js';
import { badge, fill, h, route } from './dom.js';
import { at, duration, num, pausedByGate, pct, rate, runTitle, shownStatus, TERMINAL, unitOf, when } from './format.js';
import { every, followRun } from './live.js';
import { endpointsTable, failuresList, gateText, qualityTable, shardGrid, variantsTable } from './panels.js';
import { progressCard } from './run-progress.js';

/** @typedef {import('../client/schema.js').components['schemas']} Schemas */

/** How often the run's throughput history is read again from the server; progress events fill in between. */
const HISTORY_REFRESH_MS = 10_000;

/**
 * @param {HTMLElement} root
 * @param {string} runId
 */
export function runView(root, runId) {
  const path = { id: runId };
  const getRun = () => unwrap(client.GET('/v1/runs/{id}', { params: { path } }));
  // The server's history (the whole run, however long), then the progress events seen since its last point.
  /** @type {{ t: number, sps: number, tps: number }[]} */
  let stored = [];
  /** @type {{ t: number, sps: number, tps: number }[]} */
  let recent = [];
  let historyAt = 0;
  // The chart spans the run from its start to its end: until the first answer is recorded its rate
  // was 0, and after the last recorded point of an ended run nothing more was answered (its shards
  // and manifest were written). Without these the chart would start late when the first answer took
  // longer than a history step, and end a few milliseconds before the run.
  const points = () => {
    const all = [...stored, ...recent];
    if (!all.length) return all;
    const start = run?.started_at ? Date.parse(run.started_at) : Number.NaN;
    const end = run?.finished_at ? Date.parse(run.finished_at) : Number.NaN;
    return [...(all[0].t > start ? [{ t: start, sps: 0, tps: 0 }] : []), ...all, ...(all[all.length - 1].t < end ? [{ t: end, sps: 0, tps: 0 }] : [])];
  };
  // Set by the first update, before anything reads it.
  let run = /** @type {Schemas['Run']} */ (/** @type {unknown} */ (null));
  const seen = { failed: -1, flags: '', shardsUploaded: -1, shardsAt: 0 };
  /** @type {Schemas['RunQuality'] | null} */
  let quality = null;

  const title = h('h1', null, 'Loading run…');
  // The chart's left axis counts the run's unit: samples, or a conversation run's conversations.
  const rateUnit = h('span', null, ' samples/s (left) ');
  const statusEl = h('span', null);
  const subtitle = h('div', { className: 'muted small' });
  const banner = h('div', { className: 'banner', hidden: true });
  const actionError = h('p', { className: 'error', hidden: true });
  const panelError = h('p', { className: 'error', hidden: true });
  const buttons = {
    pause: h('button', { type: 'button', onclick: () => act('pause') }, 'Pause'),
    resume: h('button', { type: 'button', className: 'primary', onclick: () => act('resume') }, 'Resume'),
    override: h('button', { type: 'button', className: 'primary', onclick: () => act('resume', { override_gate: true }) }, 'Resume, overriding the gate'),
    cancel: h('button', { type: 'button', className: 'danger', onclick: () => confirmCancel() }, 'Cancel run'),
  };
  const progressEl = h('section', { className: 'card progress-card' });
  const canvas = h('canvas', { className: 'chart', 'aria-label': 'throughput over time' });
  const forecastEl = h('div', null, h('p', { className: 'muted' }, 'No forecast yet.'));
  const forecastCanvas = h('canvas', { className: 'chart', 'aria-label': 'projected finish over time' });
  /** @type {Schemas['ForecastPoint'][]} */
  let forecastPoints = [];
  const shardsHead = h('span', { className: 'muted small' });
  const shardsEl = h('div', null, h('p', { className: 'muted' }, 'Loading shards…'));
  const endpointsEl = h('div', null, h('p', { className: 'muted' }, 'Loading endpoints…'));
  const qualityHead = h('span', { className: 'muted small' });
  const qualityEl = h('div', null);
  const failuresHead = h('span', { className: 'muted small' });
  const failuresEl = h('div', null, h('p', { className: 'muted' }, 'Loading failures…'));
  const variantsEl = h('div', null);
  const variantsCard = h('section', { className: 'card', hidden: true }, h('h2', null, 'Variants'), variantsEl);

  fill(
    root,
    h('p', { className: 'crumbs' }, h('a', { href: '#/' }, 'Runs'), ' › ', runId),
    h(
      'div',
      { className: 'run-head' },
      h('div', null, h('div', { className: 'title-row' }, title, statusEl), subtitle),
      h('div', { className: 'actions' }, Object.values(buttons)),
    ),
    banner,
    actionError,
    panelError,
    progressEl,
    variantsCard,
    h(
      'div',
      { className: 'grid2' },
      h('section', { className: 'card forecast' }, h('h2', null, 'Forecast'), forecastEl),
      h('section', { className: 'card' }, h('h2', null, 'Projected finish over time'), forecastCanvas),
    ),
    // The chart gets the page's width (a run of days is drawn in it); the shards, a compact card of their own.
    h(
      'section',
      { className: 'card' },
      h('h2', null, 'Throughput'),
      h(
        'div',
        { className: 'legend small' },
        h('span', { className: 'swatch samples' }),
        rateUnit,
        h('span', { className: 'swatch tokens' }),
        ' completion tokens/s (right)',
      ),
      canvas,
    ),
    h('section', { className: 'card shards-card' }, h('h2', null, 'Shards ', shardsHead), shardsEl),
    h('section', { className: 'card' }, h('h2', null, 'Endpoints'), endpointsEl),
    h(
      'div',
      { className: 'grid2' },
      h('section', { className: 'card' }, h('h2', null, 'Quality ', qualityHead), qualityEl),
      h('section', { className: 'card' }, h('h2', null, 'Failures ', failuresHead), failuresEl),
    ),
  );

  /** @param {Schemas['Run']} next */
  function update(next) {
    run = next;
    title.textContent = runTitle(run);
    rateUnit.textContent = ` ${unitOf(run)}/s (left) `;
    document.title = `${runTitle(run)} · regen`;
    fill(
      statusEl,
      badge(shownStatus(run)),
      run.dry_run ? h('span', { className: 'badge dry-run', title: 'A plan: only its calibration slice is answered, for the forecast' }, 'dry run') : null,
    );
    fill(subtitle, `${run.id} · ${run.model} · created ${when(run.created_at)}`, run.started_at ? ` · started ${when(run.started_at)}` : '');
    const gate = pausedByGate(run);
    // A completed run's warnings say what its status_reason says, or say it alone when its gate is off.
    const reason = run.status_reason ?? run.warnings?.map((w) => w.message).join('; ') ?? null;
    banner.hidden = !reason;
    banner.className = `banner ${gate || run.status === 'failed' || shownStatus(run) === 'completed_with_warnings' ? 'warn' : ''}`;
    fill(
      banner,
      reason ? h('strong', null, reason) : null,
      gate ? h('div', null, 'The quality gate paused this run. Look at the flagged samples below; “Resume, overriding the gate” continues without it.') : null,
    );
    buttons.pause.hidden = !['queued', 'in_progress'].includes(run.status);
    buttons.resume.hidden = run.status !== 'paused' || gate;
    buttons.override.hidden = !gate;
    buttons.cancel.hidden = !['validating', 'queued', 'in_progress', 'paused', 'finalizing'].includes(run.status);
    renderProgress();
    renderForecast();
    drawThroughput(canvas, points());
    const failed = run.request_counts.failed;
    fill(failuresHead, failed ? [`${num(failed)} · `, h('a', { href: `${route('runs', run.id, 'samples')}?status=failed` }, 'all →')] : '');
    renderQuality();
    // Polls carry the variants; a progress event does not, and leaves the table as it was.
    if (run.variants) fill(variantsEl, variantsTable(run.variants));
    variantsCard.hidden = !run.variants;
  }

  function renderForecast() {
    const f = run.forecast;
    if (!f) return;
    const row = (/** @type {string} */ label, /** @type {string} */ value) => h('tr', null, h('th', null, label), h('td', null, value));
    const finish = f.finishes_at ? `${at(f.finishes_at)} (in ${duration(f.wall_seconds_remaining)})` : '–';
    const interval = f.low != null && f.high != null ? `${duration(f.low)} to ${duration(f.high)} (90%)` : '–';
    // A finished run has no time left to forecast: what it took instead.
    const ended = TERMINAL.includes(run.status);
    fill(
      forecastEl,
      h(
        'table',
        null,
        run.dry_run
          ? [row('Whole input would take', duration(f.wall_seconds_estimate)), row('Interval', interval)]
          : ended
            ? row('Finished', `${at(run.finished_at)}, after ${duration(run.progress.elapsed_seconds)}`)
            : [row('Finishes', finish), row('Time left', interval)],
        row(
          'Completion tokens',
          ended ? num(run.usage.completion_tokens) : `${num(f.completion_tokens_estimate)} in all · ${num(f.completion_tokens_remaining)} to go`,
        ),
        row('Fleet', `${num(f.fleet.endpoints)} endpoint(s) · ${rate(f.fleet.completion_tokens_per_second)} tokens/s at their caps`),
        run.deadline_seconds != null
          ? row(
              `Deadline ${duration(run.deadline_seconds)}`,
              f.endpoints_for_deadline == null ? '–' : `${num(f.endpoints_for_deadline)} endpoint(s) like these`,
            )
          : null,
        // A conversation run's forecast rests on its answered turns; its calibration slice counts conversations.
        row(
          'Based on',
          run.turns
            ? `${num(f.based_on_samples)} turns answered (calibration slice of ${num(run.calibration.samples)} conversations)`
            : `${num(f.based_on_samples)} calibration answers (slice of ${num(run.calibration.samples)})`,
        ),
      ),
    );
  }

  function renderQuality() {
    const completed = run.request_counts.completed;
    fill(
      qualityHead,
      completed ? `${num(run.quality.flagged)} flagged (${pct(run.quality.flagged / completed)} of completed)` : '',
      quality ? ` · ${gateText(quality)}` : '',
      quality?.loops?.stopped ? ` · ${num(quality.loops.stopped)} loops cut, ${num(quality.loops.tokens_saved)} tokens saved` : '',
    );
    fill(qualityEl, qualityTable(run, quality));
  }

  function renderProgress() {
    fill(progressEl, progressCard(run));
  }

  /** A progress event (the run's changing fields) or a poll (the whole run): one more point on the chart. */
  /** @param {Schemas['RunProgressEvent'] | Schemas['Run']} fields */
  function onProgress(fields) {
    const next = { ...run, ...fields };
    if (!TERMINAL.includes(next.status) && next.status !== 'validating') {
      recent.push({ t: Date.now(), sps: next.progress.samples_per_second, tps: next.progress.completion_tokens_per_second });
    }
    update(next);
  }

  /**
   * @param {'pause' | 'resume' | 'cancel'} action
   * @param {Schemas['ResumeRun']} [body]
   */
  async function act(action, body) {
    for (const b of Object.values(buttons)) b.disabled = true;
    actionError.hidden = true;
    try {
      update(await unwrap(client.POST(`/v1/runs/{id}/${action}`, { params: { path }, body: body ?? {} })));
    } catch (err) {
      actionError.hidden = false;
      actionError.textContent = `Could not ${action} the run: ${/** @type {Error} */ (err).message}`;
    } finally {
      for (const b of Object.values(buttons)) b.disabled = false;
      resetCancel();
    }
  }

  // Cancelling cannot be undone, so it takes a second click instead of a browser dialog.
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let cancelTimer;
  function confirmCancel() {
    if (cancelTimer) return act('cancel');
    buttons.cancel.textContent = 'Click again to cancel';
    cancelTimer = setTimeout(resetCancel, 4000);
  }
  function resetCancel() {
    clearTimeout(cancelTimer);
    cancelTimer = undefined;
    buttons.cancel.textContent = 'Cancel run';
  }

  async function refreshPanels() {
    if (!run) return;
    /** @type {Promise<unknown>[]} */
    const tasks = [
      unwrap(client.GET('/v1/endpoints', { params: { query: { limit: 100 } } })).then((eps) => {
        fill(endpointsEl, endpointsTable(eps.data, run.model, quality));
      }),
      // The history comes from the server, so a page opened mid-run shows the whole story.
      unwrap(client.GET('/v1/runs/{id}/forecasts', { params: { path: { id: run.id } } })).then((history) => {
        forecastPoints = history.data;
        drawForecast(forecastCanvas, forecastPoints);
      }),
    ];
    if (!historyAt || (!TERMINAL.includes(run.status) && Date.now() - historyAt > HISTORY_REFRESH_MS)) {
      historyAt = Date.now();
      tasks.push(
        unwrap(client.GET('/v1/runs/{id}/history', { params: { path } })).then((h) => {
          stored = h.data.map((p) => ({ t: Date.parse(p.at) + p.span_seconds * 1000, sps: p.samples_per_second, tps: p.completion_tokens_per_second }));
          const last = stored.at(-1)?.t ?? 0;
          recent = recent.filter((p) => p.t > last);
          drawThroughput(canvas, points());
        }),
      );
    }
    // A shard list can be a thousand rows: read it when a shard is uploaded, else now and then.
    if (run.shards.uploaded !== seen.shardsUploaded || (!TERMINAL.includes(run.status) && Date.now() - seen.shardsAt > 10_000)) {
      seen.shardsUploaded = run.shards.uploaded;
      seen.shardsAt = Date.now();
      tasks.push(
        unwrap(client.GET('/v1/runs/{id}/shards', { params: { path, query: { limit: 1000 } } })).then((s) => {
          fill(shardsHead, `${num(run.shards.uploaded)} of ${num(run.shards.total)} uploaded · ${num(run.shard_size)} ${unitOf(run)} each`);
          fill(shardsEl, shardGrid(s.data, run.shards.total, TERMINAL.includes(run.status), unitOf(run)));
        }),
      );
    }
    if (run.request_counts.failed !== seen.failed) {
      seen.failed = run.request_counts.failed;
      tasks.push(
        unwrap(client.GET('/v1/runs/{id}/samples', { params: { path, query: { status: 'failed', limit: 100 } } })).then((s) => {
          const recent = s.data.sort((a, b) => String(b.completed_at).localeCompare(String(a.completed_at))).slice(0, 10);
          fill(failuresEl, failuresList(run, recent));
        }),
      );
    }
    const flagKey = `${run.status} ${JSON.stringify(run.quality.by_flag)}`;
    if (flagKey !== seen.flags) {
      seen.flags = flagKey;
      tasks.push(
        unwrap(client.GET('/v1/runs/{id}/quality', { params: { path } })).then((q) => {
          quality = q;
          renderQuality();
        }),
      );
    }
    await Promise.all(tasks);
  }

  // Status events come in bursts (a new stream replays the run's history): one refetch at a time.
  let refetching = null;
  function refetch() {
    refetching ??= getRun()
      .then(
        (r) => !closed && update(r),
        () => {},
      )
      .finally(() => (refetching = null));
  }

  let closed = false;
  /** @type {(() => unknown)[]} */
  const stops = [() => (closed = true)];
  const onResize = () => {
    drawThroughput(canvas, points());
    drawForecast(forecastCanvas, forecastPoints);
  };
  window.addEventListener('resize', onResize);
  stops.push(() => window.removeEventListener('resize', onResize));

  getRun()
    .then((first) => {
      if (closed) return;
      update(first);
      stops.push(every(3000, refreshPanels, panelError));
      if (TERMINAL.includes(first.status)) return;
      stops.push(
        followRun(runId, {
          onRun: onProgress,
          onStatus: refetch,
          onShard: () => (seen.shardsUploaded = -1),
        }),
      );
    })
    .catch((err) =>
      fill(
        root,
        h('p', { className: 'crumbs' }, h('a', { href: '#/' }, 'Runs')),
        h('p', { className: 'error' }, err.status === 404 ? `There is no run ${runId}.` : err.message),
      ),
    );

  return () => {
    for (const stop of stops) stop();
  };
}
