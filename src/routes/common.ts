import { z } from '@hono/zod-openapi';
import { ApiError } from '../errors.js';
import { idTime, type IdPrefix } from '../ids.js';
import { isWebhookSecret, SECRET_MESSAGE } from '../domain/webhooks.js';
import { isAllowedHost, isHttpUrlWithoutCredentials, METADATA_HOST_MESSAGE, NOT_HTTP_MESSAGE } from '../domain/endpoint-url.js';

export const iso = (ms: number | null | undefined): string | null => (ms == null ? null : new Date(ms).toISOString());

export const Timestamp = z.string().openapi({ format: 'date-time', example: '2026-12-02T14:00:00.000Z' });

/** A URL regen sends requests to: an endpoint's or a webhook's (`domain/endpoint-url.ts` has the rules). */
export const HttpUrl = z.string().max(2048).refine(isHttpUrlWithoutCredentials, NOT_HTTP_MESSAGE).refine(isAllowedHost, METADATA_HOST_MESSAGE);

/** regen's extension of a run or a batch: where its events go, signed with its own secret. */
export const WebhookTarget = z
  .object({
    url: HttpUrl.openapi({
      description: 'Receives each event as a POST (the same address rules as an endpoint URL)',
      example: 'https://hooks.example.com/regen',
    }),
    secret: z
      .string()
      .max(256)
      .refine(isWebhookSecret, SECRET_MESSAGE)
      .openapi({ description: 'Write-only: `whsec_` and the base64 of 24 to 64 random bytes; signs the events (Standard Webhooks), never returned' }),
  })
  .strict()
  .openapi('WebhookTarget', {
    description: "regen's extension (OpenAI's API has no such field): signed events for this run or batch, in place of the server's default",
  });

const idParam = (prefix: string, name: string) =>
  z.object({
    id: z
      .string()
      .max(128)
      .regex(/^[A-Za-z0-9_-]+$/, `${name} ids contain only letters, digits, "_" and "-"`)
      .openapi({ param: { name: 'id', in: 'path' }, example: `${prefix}_0mip2k3a1f3a9c0e1b2d4c6e8` }),
  });
export const RunIdParam = idParam('run', 'run');
export const EndpointIdParam = idParam('ep', 'endpoint');
export const FileIdParam = idParam('file', 'file');

/** A list's cursor: the `last_id` of one of its pages, an id of the kind it lists (`src/ids.ts` makes them). */
export const idCursor = (prefix: IdPrefix) =>
  z
    .string()
    .max(64)
    .regex(new RegExp(`^${prefix}_[0-9a-z]+$`), `must be the last_id of a previous page (a ${prefix}_… id)`);

/**
 * The query of every list: `limit`, and `after`, a cursor the list can place. A cursor it cannot
 * place is refused (`checkCursor`) rather than answered with an empty or restarted page, which
 * a client paging through would take for the end or loop on.
 */
export function pageQuery(after: z.ZodString, limit = { default: 100, max: 1000 }) {
  return z.object({
    limit: z.coerce.number().int().min(1).max(limit.max).default(limit.default).openapi({ example: limit.default }),
    after: after.optional().openapi({ description: 'The last_id of the previous page' }),
  });
}

/**
 * Refuses, before the list is read, an `after` the list cannot place: a 422 naming `after` (400 in
 * OpenAI's envelope on the OpenAI-shaped routes, as `problem` shapes it). `what` names an item of
 * the list, for the message.
 */
export async function checkCursor(after: string | undefined, what: string, placeable: (after: string) => Promise<boolean>): Promise<void> {
  if (after === undefined || (await placeable(after))) return;
  throw new ApiError('validation_failed', `after: ${JSON.stringify(after.slice(0, 100))} names no ${what}: pass the last_id of a previous page`, {
    field: 'after',
  });
}

/**
 * Where an id list (newest first) can place a cursor: at an item it holds, or where an id regen
 * made (newId: time-ordered) sorts, so that the cursor of an item deleted since its page was read
 * goes on from where the item stood. An id of that shape but from the future would restart the
 * list, and one of any other shape sorts nowhere the list means: both must name an item.
 */
export const idPlaceable =
  (prefix: IdPrefix, get: (id: string) => Promise<unknown>) =>
  async (after: string): Promise<boolean> => {
    const made = idTime(after, prefix);
    // Ids are stamped with Date.now(), not the injected clock: compared on the same one.
    return (made !== null && made <= Date.now()) || (await get(after)) !== undefined;
  };

export function listOf<T extends z.ZodTypeAny>(item: T, name: string) {
  return z
    .object({
      object: z.literal('list'),
      data: z.array(item),
      has_more: z.boolean(),
      first_id: z.string().nullable(),
      last_id: z.string().nullable(),
    })
    .openapi(name);
}

/** Cuts a `limit + 1` query result into a page; the extra row only says whether there is more. */
export function page<T, R>(rows: T[], limit: number, idOf: (r: T) => string, render: (r: T) => R) {
  const data = rows.slice(0, limit);
  return {
    object: 'list' as const,
    data: data.map(render),
    has_more: rows.length > limit,
    first_id: data.length ? idOf(data[0]) : null,
    last_id: data.length ? idOf(data[data.length - 1]) : null,
  };
}

export const jsonContent = <T extends z.ZodTypeAny>(schema: T, description: string) => ({
  content: { 'application/json': { schema } },
  description,
});
