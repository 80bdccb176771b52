// @ts-check
// Talks to /v1 through openapi-fetch, typed by the types generated from openapi.yaml (`tsc` checks
// the paths, parameters and bodies here), with the bearer token the user gave once (kept in
// localStorage). The events stream is read with fetch because EventSource cannot send an
// Authorization header.
import createClient from './vendor/openapi-fetch.js';

/** @typedef {import('../client/schema.js').paths} paths */

const TOKEN_KEY = 'regen.token';

export class ApiError extends Error {
  /**
   * @param {number} status
   * @param {string} detail
   */
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

/** @type {Promise<void> | null} */
let asking = null;

/** @param {string} id */
const element = (id) => /** @type {HTMLElement} */ (document.getElementById(id));

/**
 * Shows the token form (once, however many calls are waiting) and resolves when a token is saved.
 * @param {boolean} refused
 * @returns {Promise<void>}
 */
function askForToken(refused) {
  asking ??= new Promise((resolve) => {
    const dialog = /** @type {HTMLDialogElement} */ (element('token-dialog'));
    const form = element('token-form');
    const input = /** @type {HTMLInputElement} */ (element('token-input'));
    const error = element('token-error');
    error.hidden = !refused;
    error.textContent = refused ? 'That token was refused; check it and try again.' : '';
    input.value = '';
    const done = () => {
      form.removeEventListener('submit', onSubmit);
      window.removeEventListener('storage', onStorage);
      dialog.close();
      asking = null;
      showForget();
      resolve();
    };
    /** @param {SubmitEvent} e */
    const onSubmit = (e) => {
      e.preventDefault();
      const token = input.value.trim();
      if (!token) return;
      localStorage.setItem(TOKEN_KEY, token);
      done();
    };
    // A token entered in another tab of the dashboard answers this one too.
    /** @param {StorageEvent} e */
    const onStorage = (e) => e.key === TOKEN_KEY && e.newValue && done();
    form.addEventListener('submit', onSubmit);
    window.addEventListener('storage', onStorage);
    dialog.showModal();
    input.focus();
  });
  return asking;
}

function showForget() {
  element('forget-token').hidden = !localStorage.getItem(TOKEN_KEY);
}

export function initAuth() {
  showForget();
  // The form must be answered: without a token the page has nothing to show.
  element('token-dialog').addEventListener('cancel', (e) => e.preventDefault());
  element('forget-token').addEventListener('click', () => {
    localStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
}

/**
 * fetch with the token; a 401 asks for the token and tries again.
 * @param {Request} request
 * @returns {Promise<Response>}
 */
async function authFetch(request) {
  for (let tries = 0; ; tries++) {
    // A copy for each try: a body can be sent only once.
    const attempt = request.clone();
    const token = localStorage.getItem(TOKEN_KEY);
    if (token) attempt.headers.set('authorization', `Bearer ${token}`);
    const res = await fetch(attempt);
    if (res.status !== 401 || tries > 5) return res;
    await askForToken(!!token);
  }
}

/**
 * The typed client of this origin's API: `unwrap(client.GET('/v1/runs/{id}', { params: { path: { id } } }))`.
 * @type {import('./vendor/openapi-fetch.js').Client<paths>}
 */
export const client = createClient({ baseUrl: location.origin, fetch: authFetch });

/**
 * The body of a 2xx answer; otherwise an ApiError with the problem's detail.
 * @template T
 * @param {Promise<{ data?: T, error?: unknown, response: Response }>} call
 * @returns {Promise<T>}
 */
export async function unwrap(call) {
  const { data, error, response } = await call;
  if (!response.ok) {
    const detail = /** @type {{ detail?: string } | undefined} */ (error)?.detail;
    throw new ApiError(response.status, detail ?? `${new URL(response.url).pathname} answered ${response.status}`);
  }
  return /** @type {T} */ (data);
}

/**
 * Reads a run's server-sent events, calling onEvent(type, data) for each, until the stream ends or
 * `signal` aborts. Resolves 'ended' when the server closed the stream and 'missing' when the
 * server has no events route (the caller then polls).
 * @param {string} runId
 * @param {(type: string, data: unknown, id: string | null) => void} onEvent
 * @param {AbortSignal} signal
 * @param {string | null} lastEventId
 * @returns {Promise<'ended' | 'missing'>}
 */
export async function streamEvents(runId, onEvent, signal, lastEventId) {
  const { data: body, response: res } = await client.GET('/v1/runs/{id}/events', {
    params: { path: { id: runId }, header: lastEventId ? { 'last-event-id': lastEventId } : {} },
    headers: { accept: 'text/event-stream' },
    parseAs: 'stream',
    signal,
  });
  const type = res.headers.get('content-type') ?? '';
  if (!body || !type.startsWith('text/event-stream')) {
    // The body is there only on a 2xx; openapi-fetch has read an error's already.
    await body?.cancel();
    if (res.status === 404 || res.status === 405 || (res.ok && !type.startsWith('text/event-stream'))) return 'missing';
    throw new ApiError(res.status, `the events stream answered ${res.status}`);
  }
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  /** @type {{ type: string, data: string[], id: string | null }} */
  let event = { type: 'message', data: [], id: null };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return 'ended';
    buffer += value;
    let nl;
    while ((nl = buffer.search(/\r\n|\r|\n/)) >= 0) {
      if (nl === buffer.length - 1 && buffer[nl] === '\r') break; // a \r\n split across chunks
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + (buffer.startsWith('\r\n', nl) ? 2 : 1));
      if (line === '') {
        if (event.data.length) {
          /** @type {unknown} */
          let data = event.data.join('\n');
          try {
            data = JSON.parse(/** @type {string} */ (data));
          } catch {
            /* plain text data stays text */
          }
          onEvent(event.type, data, event.id);
        }
        event = { type: 'message', data: [], id: null };
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      const val = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
      if (field === 'event') event.type = val;
      else if (field === 'data') event.data.push(val);
      else if (field === 'id') event.id = val;
    }
  }
}
