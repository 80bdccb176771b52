// Talks to /v1 with the bearer token the user gave once (kept in localStorage). The events stream
// is read with fetch because EventSource cannot send an Authorization header.

const TOKEN_KEY = 'regen.token';

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

let asking = null;

/** Shows the token form (once, however many calls are waiting) and resolves when a token is saved. */
function askForToken(refused) {
  asking ??= new Promise((resolve) => {
    const dialog = document.getElementById('token-dialog');
    const form = document.getElementById('token-form');
    const input = document.getElementById('token-input');
    const error = document.getElementById('token-error');
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
    const onSubmit = (e) => {
      e.preventDefault();
      const token = input.value.trim();
      if (!token) return;
      localStorage.setItem(TOKEN_KEY, token);
      done();
    };
    // A token entered in another tab of the dashboard answers this one too.
    const onStorage = (e) => e.key === TOKEN_KEY && e.newValue && done();
    form.addEventListener('submit', onSubmit);
    window.addEventListener('storage', onStorage);
    dialog.showModal();
    input.focus();
  });
  return asking;
}

function showForget() {
  document.getElementById('forget-token').hidden = !localStorage.getItem(TOKEN_KEY);
}

export function initAuth() {
  showForget();
  // The form must be answered: without a token the page has nothing to show.
  document.getElementById('token-dialog').addEventListener('cancel', (e) => e.preventDefault());
  document.getElementById('forget-token').addEventListener('click', () => {
    localStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
}

function authHeaders(extra) {
  const token = localStorage.getItem(TOKEN_KEY);
  return { ...(token ? { authorization: `Bearer ${token}` } : {}), ...extra };
}

/** fetch with the token; a 401 asks for the token and tries again. */
async function authFetch(path, init = {}) {
  for (let tries = 0; ; tries++) {
    const res = await fetch(path, { ...init, headers: authHeaders(init.headers) });
    if (res.status !== 401 || tries > 5) return res;
    await askForToken(!!localStorage.getItem(TOKEN_KEY));
  }
}

/** GET (or POST with `json`) a /v1 path; throws ApiError with the problem's detail. */
export async function api(path, { method = 'GET', json } = {}) {
  const res = await authFetch(path, {
    method,
    ...(json !== undefined ? { body: JSON.stringify(json), headers: { 'content-type': 'application/json' } } : {}),
  });
  const text = await res.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!res.ok) throw new ApiError(res.status, body?.detail ?? `${method} ${path} answered ${res.status}`);
  return body;
}

/**
 * Reads a run's server-sent events, calling onEvent(type, data) for each, until the stream ends or
 * `signal` aborts. Resolves 'ended' when the server closed the stream and 'missing' when the
 * server has no events route (the caller then polls).
 */
export async function streamEvents(runId, onEvent, signal, lastEventId) {
  const res = await authFetch(`/v1/runs/${encodeURIComponent(runId)}/events`, {
    signal,
    headers: { accept: 'text/event-stream', ...(lastEventId ? { 'last-event-id': lastEventId } : {}) },
  });
  const type = res.headers.get('content-type') ?? '';
  if (!res.ok || !type.startsWith('text/event-stream') || !res.body) {
    await res.body?.cancel();
    if (res.status === 404 || res.status === 405 || (res.ok && !type.startsWith('text/event-stream'))) return 'missing';
    throw new ApiError(res.status, `the events stream answered ${res.status}`);
  }
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
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
          let data = event.data.join('\n');
          try {
            data = JSON.parse(data);
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
