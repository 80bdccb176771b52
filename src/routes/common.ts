import { z } from '@hono/zod-openapi';

export const iso = (ms: number | null | undefined): string | null => (ms == null ? null : new Date(ms).toISOString());

export const Timestamp = z.string().openapi({ format: 'date-time', example: '2026-12-02T14:00:00.000Z' });

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

export const PageQuery = z.object({
  limit: z.coerce.number().int().min(1).max(1000).default(100).openapi({ example: 100 }),
  after: z.string().max(256).optional().openapi({ description: 'The last_id of the previous page' }),
});

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
