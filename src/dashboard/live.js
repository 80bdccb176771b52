// @ts-check
// Keeping a view current: a polling loop for lists, and for one run its event stream (with polling
// when the server has no events route, and reconnects when the stream drops).
import { client, streamEvents, unwrap } from './api.js';
import { TERMINAL } from './format.js';

/** @typedef {import('../client/schema.js').components['schemas']} Schemas */

/**
 * @param {number} ms
 * @param {AbortSignal} signal
 */
const sleep = (ms, signal) =>
  /** @type {Promise<void>} */ (
    new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      signal?.addEventListener('abort', () => {
        clearTimeout(timer);
        resolve();
      });
    })
  );

/**
 * @param {string | null} text
 * @param {string} [state]
 */
export function setLive(text, state) {
  const el = /** @type {HTMLElement} */ (document.getElementById('live'));
  el.hidden = !text;
  el.textContent = text ?? '';
  el.className = `live ${state ?? ''}`;
}

/**
 * Runs `fn` now and then every `ms` after it finishes, until the returned stop function is called.
 * @param {number} ms
 * @param {() => Promise<unknown>} fn
 * @param {HTMLElement} [errorEl]
 */
export function every(ms, fn, errorEl) {
  const abort = new AbortController();
  void (async () => {
    while (!abort.signal.aborted) {
      try {
        await fn();
        if (errorEl) errorEl.hidden = true;
      } catch (err) {
        if (errorEl && !abort.signal.aborted) {
          errorEl.hidden = false;
          errorEl.textContent = /** @type {Error} */ (err).message;
        }
      }
      await sleep(ms, abort.signal);
    }
  })();
  return () => abort.abort();
}

/**
 * Follows one run until it ends or the view goes away: onRun(fields) for every progress event (the
 * run's changing fields: status, counts, quality, usage, shards, progress) or poll (the whole run),
 * onStatus() when its status changes, onShard() when a shard is uploaded.
 * @param {string} runId
 * @param {{
 *   onRun: (run: Schemas['RunProgressEvent'] | Schemas['Run']) => void,
 *   onStatus: (event?: Schemas['RunStatusEvent']) => void,
 *   onShard: (event: Schemas['ShardUploadedEvent']) => void,
 * }} handlers
 */
export function followRun(runId, { onRun, onStatus, onShard }) {
  const abort = new AbortController();
  const { signal } = abort;
  /** @type {string | null} */
  let status = null;
  /** @param {Schemas['RunProgressEvent'] | Schemas['Run']} run */
  const track = (run) => {
    const changed = status !== null && run.status !== status;
    status = run.status;
    onRun(run);
    if (changed) onStatus();
  };
  const poll = async () => {
    setLive('polling', 'polling');
    while (!signal.aborted && !(status && TERMINAL.includes(status))) {
      try {
        track(await unwrap(client.GET('/v1/runs/{id}', { params: { path: { id: runId } } })));
      } catch {
        /* shown as stale numbers; the next poll tries again */
      }
      await sleep(1000, signal);
    }
  };
  void (async () => {
    let lastEventId = null;
    while (!signal.aborted) {
      setLive('connecting…', 'off');
      try {
        const end = await streamEvents(
          runId,
          (type, data, id) => {
            if (id) lastEventId = id;
            setLive('live', 'on');
            // Each event's data is the schema of its name (RunProgressEvent, RunStatusEvent, ShardUploadedEvent).
            if (type === 'progress') track(/** @type {Schemas['RunProgressEvent']} */ (data));
            else if (type === 'status') onStatus(/** @type {Schemas['RunStatusEvent']} */ (data));
            else if (type === 'shard_uploaded') onShard(/** @type {Schemas['ShardUploadedEvent']} */ (data));
          },
          signal,
          lastEventId,
        );
        if (end === 'missing') {
          await poll();
          break;
        }
        const run = await unwrap(client.GET('/v1/runs/{id}', { params: { path: { id: runId } } }));
        track(run);
        if (TERMINAL.includes(run.status)) break;
      } catch {
        if (signal.aborted) return;
      }
      await sleep(2000, signal);
    }
    if (!signal.aborted) setLive('run ended', 'ended');
  })();
  return () => {
    abort.abort();
    setLive(null);
  };
}
