import type { components } from '../client/index.js';
import { ApiCallError, type Client } from './client.js';
import { TERMINAL } from './format.js';

/** The fields of a run that a `progress` event carries. */
export type RunProgress = components['schemas']['RunProgressEvent'];

interface SseEvent {
  type: string;
  data: string;
  id: string | null;
}

/** Server-sent events from a response body, one object per event. */
async function* sseEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const decoder = new TextDecoder();
  let buffer = '';
  let event: SseEvent = { type: 'message', data: '', id: null };
  let hasData = false;
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buffer.search(/\r\n|\r|\n/)) >= 0) {
      if (nl === buffer.length - 1 && buffer[nl] === '\r') break; // a \r\n split across chunks
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + (buffer.startsWith('\r\n', nl) ? 2 : 1));
      if (line === '') {
        if (hasData) yield event;
        event = { type: 'message', data: '', id: null };
        hasData = false;
      } else if (!line.startsWith(':')) {
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') event.type = value;
        else if (field === 'id') event.id = value;
        else if (field === 'data') {
          event.data = hasData ? `${event.data}\n${value}` : value;
          hasData = true;
        }
      }
    }
  }
}

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
  });

/**
 * Calls onProgress with the run's fields about once a second until the run is terminal, `stopWhen`
 * says so, or `signal` aborts; returns the last state seen. Reads the run's event stream,
 * reconnecting where it left off, and polls the run when the server has no events route.
 */
export async function followRun(
  client: Client,
  runId: string,
  onProgress: (run: RunProgress) => void,
  signal: AbortSignal,
  stopWhen: (run: RunProgress) => boolean,
): Promise<RunProgress | null> {
  const path = { id: runId };
  let last: RunProgress | null = null;
  const seen = (run: RunProgress) => {
    last = run;
    onProgress(run);
    return TERMINAL.includes(run.status) || stopWhen(run);
  };
  let lastEventId: string | null = null;
  let streaming = true;
  while (!signal.aborted) {
    try {
      if (streaming) {
        const header: { 'last-event-id'?: string } = lastEventId ? { 'last-event-id': lastEventId } : {};
        // The whole answer, not just its body: a 2xx that is no event stream means there is none.
        const {
          data: stream,
          error,
          response,
        } = await client.api.GET('/v1/runs/{id}/events', {
          params: { path, header },
          headers: { accept: 'text/event-stream' },
          parseAs: 'stream',
          signal,
        });
        if (stream && (response.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
          for await (const event of sseEvents(stream)) {
            if (event.id) lastEventId = event.id;
            if (event.type === 'progress' && seen(JSON.parse(event.data) as RunProgress)) {
              await stream.cancel().catch(() => {});
              return last;
            }
          }
        } else if (response.status === 404 || response.status === 405 || response.ok) {
          // The run was found before following it: a 404 here means an older server without the events route.
          await stream?.cancel();
          streaming = false;
          continue;
        } else if (response.status === 401) throw new ApiCallError(401, error);
      }
      // The stream ended (or there is none): read the run itself, then go on unless it is over.
      if (seen(await client.get('/v1/runs/{id}', { params: { path } }))) return last;
    } catch (err) {
      if (signal.aborted) break;
      if (err instanceof ApiCallError && (err.status === 401 || err.status === 404)) throw err;
    }
    await sleep(streaming ? 2000 : 1000, signal);
  }
  return last;
}
