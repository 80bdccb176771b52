import type { EndpointWithoutIds } from '../domain/live-view.js';
import type { Logger } from '../logger.js';
import type { LiveEndpoint } from './live-endpoint.js';
import { EventStreamParser } from './sse.js';
import { StreamedAnswer } from './stream-answer.js';
import { ID_PARAMS, type IdMode, pickIds } from './token-ids.js';

// Which token-id parameters an endpoint answers, found out by asking, not configured: the first
// time a run that writes ids (output.tokens) would use it, and again after it restarts
// (endpoint-probes.ts forgets the mode) or answers a 400 naming an id parameter (requests.ts).

/** A probe asks one token: the cost of knowing is one tiny request per parameter tried. */
const PROBE_BODY = { messages: [{ role: 'user', content: 'Say OK.' }], max_tokens: 1, temperature: 0 };
const PROBE_TIMEOUT_MS = 30_000;

/**
 * The modes tried, best first: sglext ids come back on a stream; return_token_ids is tried on a
 * stream (vLLM streams its ids, SGLang refuses them there), then unstreamed.
 */
const TRIED = ['sglext', 'streamed_token_ids', 'token_ids'] as const;
const STREAMED: ReadonlySet<IdMode> = new Set(['streamed_token_ids']);

/** A streamed probe's events put back together as one answer, as the runner reads a stream. */
export function readStream(text: string): unknown {
  const answer = new StreamedAnswer();
  for (const data of new EventStreamParser().push(text)) if (data.trim() !== '[DONE]') answer.add(data);
  return answer.response();
}

async function answersWith(e: LiveEndpoint, model: string, mode: (typeof TRIED)[number]): Promise<boolean> {
  const stream = STREAMED.has(mode) ? { stream: true, stream_options: { include_usage: true } } : {};
  const res = await fetch(`${e.row.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...e.extraHeaders, ...(e.row.apiKey && { authorization: `Bearer ${e.row.apiKey}` }) },
    body: JSON.stringify({ ...PROBE_BODY, model, ...stream, ...ID_PARAMS[mode] }),
    signal: AbortSignal.timeout(PROBE_TIMEOUT_MS),
  });
  // A server that refuses the parameter does not have it; any other failure is not an answer.
  if (res.status === 400 || res.status === 422) return false;
  if (!res.ok) throw new Error(`the token-id probe got HTTP ${res.status}`);
  // Whether the ids come back at all: whether they can be trusted is each answer's check (token-ids.ts readIds).
  if (!STREAMED.has(mode)) return typeof pickIds(await res.json(), mode, 1) !== 'string';
  const text = await res.text();
  try {
    return typeof pickIds(readStream(text), mode, 1) !== 'string';
  } catch {
    // A stream regen cannot read returns it no ids.
    return false;
  }
}

/** Finds how `e` returns ids, once at a time; a probe that fails leaves the mode unknown, to be tried again. */
export function probeIds(e: LiveEndpoint, model: string, logger: Logger): void {
  if (e.idProbe || e.idMode !== null) return;
  e.idProbe = (async () => {
    let found: IdMode = 'none';
    for (const mode of TRIED) {
      if (await answersWith(e, model, mode)) {
        found = mode;
        break;
      }
    }
    e.idMode = found;
    logger.info({ endpoint_id: e.row.id, url: e.row.url, token_ids: found }, 'probed how the endpoint returns token ids');
  })()
    .catch((err: Error) => logger.warn({ endpoint_id: e.row.id, err: { message: err.message } }, 'the token-id probe failed; it is tried again'))
    .finally(() => {
      e.idProbe = null;
    });
}

/** Whether `e` may take a sample of `run` now: a run that writes ids only where they come back; unknown starts a probe. */
export function servesIds(e: LiveEndpoint, run: { outputTokens: boolean; model: string }, logger: Logger): boolean {
  if (!run.outputTokens) return true;
  if (e.idMode === null) probeIds(e, run.model, logger);
  return e.idMode !== null && e.idMode !== 'none';
}

/** The endpoints serving `model` that return no token ids, and why: those a run that writes ids is not sent to. */
function endpointsWithoutIds(endpoints: Iterable<LiveEndpoint>, model: string): EndpointWithoutIds[] {
  return [...endpoints]
    .filter((e) => e.serves(model) && e.idMode === 'none')
    .map((e) => ({
      endpoint_id: e.row.id,
      name: e.row.name,
      reason:
        e.idRefusals >= MAX_ID_REFUSALS
          ? `refused the token-id parameters its probe found ${e.idRefusals} times since it started`
          : 'returns no token ids: its probe found neither return_input_ids nor return_token_ids',
    }));
}

/** What a run's live view says of the endpoints it is not sent to for want of ids; undefined when none (or it writes no ids). */
export function withoutIds(endpoints: Iterable<LiveEndpoint>, run: { outputTokens: boolean; model: string }): EndpointWithoutIds[] | undefined {
  if (!run.outputTokens) return undefined;
  const without = endpointsWithoutIds(endpoints, run.model);
  return without.length ? without : undefined;
}

/** Why no endpoint serves a run that writes ids, or null when one does (or none was asked yet). */
export function idsReason(endpoints: Iterable<LiveEndpoint>, model: string): string | null {
  const all = [...endpoints];
  const without = endpointsWithoutIds(all, model);
  if (!without.length || all.some((e) => e.serves(model) && e.idMode !== 'none')) return null;
  return `waiting for an endpoint that returns token ids (output.tokens): ${without.map((e) => e.name).join(', ')} return none; SGLang returns them since return_token_ids (PR #30917), or launch a newer server`;
}

/**
 * Requests refused for their id parameters while the probe found them taken (a server that takes
 * them unstreamed, say, and refuses them on a stream): it would be probed and asked again for ever. Past this many
 * since it started, it counts as returning none.
 */
const MAX_ID_REFUSALS = 3;

/** An answer refused the id parameters: probed again, or, refused too often, taken for a server without ids. */
export function idRefused(e: LiveEndpoint, logger: Logger): void {
  e.idRefusals++;
  e.idMode = e.idRefusals >= MAX_ID_REFUSALS ? 'none' : null;
  if (e.idMode === 'none') {
    logger.warn(
      { endpoint_id: e.row.id, refusals: e.idRefusals },
      'the endpoint keeps refusing the token-id parameters its probe found: it serves no run that writes ids until it restarts',
    );
  }
}
