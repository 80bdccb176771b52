import type { Deps } from '../deps.js';
import { deleteEndpoint, getEndpoint, getEndpointByUrl, insertEndpoint, updateEndpoint } from '../db/endpoints.js';
import type { EndpointRow } from '../db/schema.js';
import { isUniqueViolation } from '../db/client.js';
import { normalizeEndpointUrl } from '../domain/endpoint-url.js';
import { type EndpointState, type OPERATOR_ENDPOINT_STATES, PARKED_ENDPOINT_STATES } from '../domain/statuses.js';
import { notFound } from '../errors.js';
import { newId } from '../ids.js';
import type { EndpointShare, ScheduleWindow } from '../domain/schedule.js';

/** An endpoint as registered: the body of POST /v1/endpoints, as its route has validated it. */
export interface NewEndpoint {
  url: string;
  name?: string;
  api_key?: string;
  max_concurrency?: number;
  weight?: number;
  labels?: Record<string, string>;
  aliases?: string[];
  request_priority?: number | null;
  bulk_header?: boolean;
  share?: EndpointShare | null;
  schedule?: ScheduleWindow[] | null;
  timezone?: string;
  lend_until?: string | null;
  drain_grace_ms?: number | null;
}

/** What an operator may change on an endpoint: the body of PATCH /v1/endpoints/{id}. */
export interface EndpointChange {
  name?: string;
  max_concurrency?: number | null;
  weight?: number;
  state?: (typeof OPERATOR_ENDPOINT_STATES)[number];
  api_key?: string | null;
  labels?: Record<string, string>;
  aliases?: string[];
  request_priority?: number | null;
  bulk_header?: boolean;
  share?: EndpointShare | null;
  schedule?: ScheduleWindow[] | null;
  timezone?: string;
  lend_until?: string | null;
  drain_grace_ms?: number | null;
}

/** The columns of the fields a request gave; a field it left out leaves its column as it is. */
function givenColumns(body: NewEndpoint | EndpointChange) {
  return {
    ...(body.name !== undefined && { name: body.name }),
    ...(body.api_key !== undefined && { apiKey: body.api_key }),
    ...(body.max_concurrency !== undefined && { maxConcurrency: body.max_concurrency }),
    ...(body.weight !== undefined && { weight: body.weight }),
    ...(body.labels !== undefined && { labels: body.labels }),
    ...(body.aliases !== undefined && { aliases: body.aliases }),
    // A priority given again is tried again, on a server that may have been relaunched to take it.
    ...(body.request_priority !== undefined && { requestPriority: body.request_priority, priorityRefusedAt: null }),
    ...(body.bulk_header !== undefined && { bulkHeader: body.bulk_header }),
    ...(body.share !== undefined && { share: body.share }),
    ...(body.schedule !== undefined && { schedule: body.schedule }),
    ...(body.timezone !== undefined && { timezone: body.timezone }),
    ...(body.lend_until !== undefined && { lendUntil: body.lend_until === null ? null : Date.parse(body.lend_until) }),
    ...(body.drain_grace_ms !== undefined && { drainGraceMs: body.drain_grace_ms }),
  };
}

/**
 * Registers an endpoint, or updates the one with the same URL: a launch script calls this on every
 * boot. Returns the endpoint and whether it is new.
 */
export async function upsertEndpoint(deps: Deps, body: NewEndpoint): Promise<{ endpoint: EndpointRow; created: boolean }> {
  const url = normalizeEndpointUrl(body.url);
  const existing = await getEndpointByUrl(deps.db, url);
  // Read after the lookup: the write's updatedAt is as late as it can be (runner/endpoints.ts setState).
  const now = deps.clock();
  const given = givenColumns(body);
  let id: string;
  if (existing) {
    id = existing.id;
    // A re-registration usually means the server restarted: probe it again unless an operator parked it.
    const state = PARKED_ENDPOINT_STATES.includes(existing.state as EndpointState) ? existing.state : 'starting';
    await updateEndpoint(deps.db, id, { ...given, state, updatedAt: now });
    if (state !== existing.state) deps.logger.info({ endpoint_id: id, url, from: existing.state, state }, 'endpoint state');
  } else {
    id = newId('ep');
    try {
      await insertEndpoint(deps.db, { id, url, name: body.name ?? new URL(url).host, state: 'starting', createdAt: now, updatedAt: now, ...given });
    } catch (err) {
      // Two registrations of one URL at once (a fleet's launch scripts, two replicas): the other
      // inserted first, so this one is the update of what it inserted.
      if (isUniqueViolation(err, 'url')) return upsertEndpoint(deps, body);
      throw err;
    }
    deps.logger.info({ endpoint_id: id, url, state: 'starting' }, 'endpoint registered');
  }
  deps.runner.wake();
  return { endpoint: (await getEndpoint(deps.db, id))!, created: !existing };
}

export async function patchEndpoint(deps: Deps, id: string, body: EndpointChange): Promise<EndpointRow> {
  const row = await getEndpoint(deps.db, id);
  if (!row) throw notFound('endpoint', id);
  const set = {
    ...givenColumns(body),
    // Re-enabling goes through a probe rather than trusting the operator's word.
    ...(body.state !== undefined && { state: body.state === 'ready' ? 'starting' : body.state }),
    updatedAt: deps.clock(),
  };
  await updateEndpoint(deps.db, id, set);
  if (body.state && set.state !== row.state) deps.logger.info({ endpoint_id: id, from: row.state, state: set.state }, 'endpoint state');
  deps.runner.wake();
  return (await getEndpoint(deps.db, id))!;
}

/** Removes an endpoint; the runner aborts its in-flight requests and their samples return to the queue. */
export async function removeEndpoint(deps: Deps, id: string): Promise<void> {
  if (!(await getEndpoint(deps.db, id))) throw notFound('endpoint', id);
  await deleteEndpoint(deps.db, id);
  deps.logger.info({ endpoint_id: id }, 'endpoint removed');
  deps.runner.wake();
}
