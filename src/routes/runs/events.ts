import { createRoute, z } from '@hono/zod-openapi';
import { streamSSE, type SSEStreamingApi } from 'hono/streaming';
import type { App } from '../../http/app.js';
import type { Db } from '../../db/client.js';
import { eventsAfter, hasEvent } from '../../db/events.js';
import { getRun } from '../../db/runs.js';
import { TERMINAL_RUN_STATUSES, type RunStatus } from '../../domain/statuses.js';
import type { Deps } from '../../deps.js';
import { ApiError, notFound, problemResponses } from '../../errors.js';
import { iso, RunIdParam } from '../common.js';
import { renderRun } from './render.js';
import { Run, RunStatus as RunStatusSchema } from './schemas.js';

/** How often the events table is read: a status change reaches the client within this. */
const POLL_MS = 250;
const PROGRESS_EVERY_MS = 1000;
const EVENTS_PER_READ = 500;

export const RunProgressEvent = Run.pick({
  id: true,
  status: true,
  status_reason: true,
  request_counts: true,
  turns: true,
  quality: true,
  usage: true,
  shards: true,
  progress: true,
  forecast: true,
}).openapi('RunProgressEvent');

export const RunStatusEvent = z
  .object({ run_id: z.string(), status: RunStatusSchema, reason: z.string().nullable(), at: z.string() })
  .openapi('RunStatusEvent');

export const EndpointQuarantinedEvent = z
  .object({ run_id: z.string(), endpoint_id: z.string(), reason: z.string(), at: z.string() })
  .openapi('EndpointQuarantinedEvent');

export const ShardUploadedEvent = z
  .object({
    run_id: z.string(),
    shard: z.number().int(),
    key: z.string().nullable().openapi({ description: 'null for an empty shard: no file is written' }),
    lines: z.number().int(),
    errors: z.number().int(),
    at: z.string(),
  })
  .openapi('ShardUploadedEvent');

const route = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/events',
  operationId: 'followRunEvents',
  tags: ['runs'],
  summary: 'Follow a run as Server-Sent Events',
  description: [
    'A `text/event-stream` with three kinds of event:',
    "- `progress` about once a second: the run's status, counts, quality, usage, shards, progress and forecast (RunProgressEvent); no id.",
    '- `status` on each status change (RunStatusEvent), `shard_uploaded` when a shard is in object storage (ShardUploadedEvent),',
    '  and `endpoint_quarantined` when the quality gate takes an endpoint out for its answers (EndpointQuarantinedEvent);',
    "  their ids are the run's event ids, so a client reconnecting with `Last-Event-ID` receives every one it missed.",
    "A new connection without `Last-Event-ID` first replays the run's history; a `Last-Event-ID` that is not one of this run's",
    'event ids is refused (422 naming it), since a replay from the start would repeat events the client has seen. The stream ends after the status event of a',
    'terminal status (completed, failed, cancelled): close the EventSource then, or it reconnects and gets the end again.',
  ].join('\n'),
  request: {
    params: RunIdParam,
    headers: z.object({
      'last-event-id': z
        .string()
        .regex(/^\d{1,15}$/, 'must be an event id from this stream')
        .optional()
        .openapi({ description: 'Resume after this event id (sent by EventSource on reconnect)' }),
    }),
  },
  responses: {
    200: {
      description: 'The event stream; see the description for its events',
      content: {
        'text/event-stream': {
          schema: z.string().openapi({ example: 'event: status\ndata: {"run_id":"run_…","status":"in_progress","reason":null,"at":"…"}\nid: 42\n\n' }),
        },
      },
    },
    ...problemResponses(401, 404, 422),
  },
});

export function registerRunEvents(app: App) {
  app.openAPIRegistry.register('RunStatusEvent', RunStatusEvent);
  app.openAPIRegistry.register('ShardUploadedEvent', ShardUploadedEvent);
  app.openAPIRegistry.register('EndpointQuarantinedEvent', EndpointQuarantinedEvent);
  app.openAPIRegistry.register('RunProgressEvent', RunProgressEvent);
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { id } = c.req.valid('param');
    const lastEventId = c.req.valid('header')['last-event-id'];
    if (!(await getRun(deps.db, id))) throw notFound('run', id);
    // An id this stream never sent (another run's, or a store since reset) cannot be resumed from:
    // replaying from the start would hand the client events it has already acted on.
    if (lastEventId !== undefined && !(await hasEvent(deps.db, id, Number(lastEventId)))) {
      throw new ApiError('validation_failed', `last-event-id: ${lastEventId} is not an event of this run's stream`, { field: 'last-event-id' });
    }
    const after = Number(lastEventId ?? 0);
    // A reverse proxy (nginx) would otherwise hold the events back in its buffer.
    c.header('X-Accel-Buffering', 'no');
    return streamSSE(c, (stream) => follow(deps, id, after, stream)) as never;
  });
}

/** Writes the run's events until it reaches a terminal status or the client goes away. */
async function follow(deps: Deps, runId: string, after: number, stream: SSEStreamingApi): Promise<void> {
  const closed = deps.metrics.streamOpened();
  let timer: NodeJS.Timeout | undefined;
  let wake: (() => void) | undefined;
  stream.onAbort(() => {
    clearTimeout(timer);
    wake?.();
  });
  let cursor = after;
  let progressAt = -Infinity;
  let heldBefore = false;
  try {
    while (!stream.aborted) {
      const run = await getRun(deps.db, runId);
      if (!run) return;
      // The status and its event are committed together, so a terminal row means its event is readable now.
      const terminal = TERMINAL_RUN_STATUSES.includes(run.status as RunStatus);
      if (terminal || performance.now() - progressAt >= PROGRESS_EVERY_MS) {
        progressAt = performance.now();
        const { id, status, status_reason, request_counts, turns, quality, usage, shards, progress, forecast } = renderRun(
          run,
          deps.runner.runProgress(runId),
          deps.clock(),
        );
        await stream.writeSSE({
          event: 'progress',
          data: JSON.stringify({ id, status, status_reason, request_counts, turns, quality, usage, shards, progress, forecast }),
        });
      }
      const sent = await sendEvents(deps.db, runId, cursor, stream, !terminal && !heldBefore);
      cursor = sent.cursor;
      if (terminal) return;
      // The run ended between reading its row and its events: its last progress goes before its
      // terminal status event, read again at once, so the stream still ends with that event.
      heldBefore = sent.held;
      if (sent.held) continue;
      await new Promise<void>((resolve) => {
        wake = resolve;
        timer = setTimeout(resolve, POLL_MS);
      });
    }
  } catch (err) {
    deps.logger.warn({ run_id: runId, err: { message: (err as Error).message } }, 'run event stream failed');
  } finally {
    clearTimeout(timer);
    closed();
  }
}

/**
 * Writes the run's events after `cursor`. With `holdEnd`, a terminal status event that is the run's
 * newest event is held back (not written, the cursor left before it): the caller read the run's row
 * before that status was committed, and sends the run's final progress first.
 */
async function sendEvents(db: Db, runId: string, cursor: number, stream: SSEStreamingApi, holdEnd: boolean): Promise<{ cursor: number; held: boolean }> {
  for (;;) {
    const rows = await eventsAfter(db, runId, cursor, EVENTS_PER_READ);
    for (const [i, e] of rows.entries()) {
      const newest = i === rows.length - 1 && rows.length < EVENTS_PER_READ;
      if (holdEnd && newest && e.type === 'status' && TERMINAL_RUN_STATUSES.includes((e.data as { status: RunStatus }).status)) return { cursor, held: true };
      await stream.writeSSE({ id: String(e.id), event: e.type, data: JSON.stringify({ run_id: runId, ...e.data, at: iso(e.createdAt) }) });
      cursor = e.id;
    }
    if (rows.length < EVENTS_PER_READ) return { cursor, held: false };
  }
}
