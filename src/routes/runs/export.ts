import { createRoute, z } from '@hono/zod-openapi';
import { Readable } from 'node:stream';
import type { App } from '../../http/app.js';
import { problemResponses } from '../../errors.js';
import { SPLIT_NAMES } from '../../domain/assign.js';
import { VARIANT_NAME } from '../../domain/variants.js';
import { EXPORT_FORMATS } from '../../services/runs/export-format.js';
import { exportRun } from '../../services/runs/export.js';
import { RunIdParam } from '../common.js';

/** The media type of each export format (Parquet's as registered with IANA). */
const CONTENT_TYPE = { jsonl: 'application/jsonl', parquet: 'application/vnd.apache.parquet' } as const;

const binary = z.string().openapi({ format: 'binary' });

const route = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/export',
  operationId: 'exportRun',
  tags: ['runs'],
  summary: "A run's completed samples as one file, streamed: JSONL or Parquet, of one split or variant if asked",
  description:
    "For a run that ended with its shards written (completed, or cancelled with its manifest). Each shard is checked against the manifest's sha256 before any of its bytes are sent: a mismatch in the first is a 409 naming the shard; in a later one the answer is cut off (the connection closes before the end of the body), so that no reader takes the file for whole.",
  request: {
    params: RunIdParam,
    query: z
      .object({
        split: z.enum(SPLIT_NAMES).optional().openapi({ description: 'Only the samples of this split (a run made with `split`)' }),
        variant: z
          .string()
          .regex(VARIANT_NAME, 'must be a variant name: 1 to 64 letters, digits, "_", "." or "-"')
          .optional()
          .openapi({ description: 'Only the samples of this variant (a run made with `variants`)' }),
        format: z.enum(EXPORT_FORMATS).optional().openapi({
          description:
            "The file's format: the run's own by default (jsonl for jsonl and conversations runs). A chat run in jsonl exports as parquet with the rows a Parquet run writes; a Parquet run as jsonl with one JSON object a row",
        }),
      })
      .strict(),
  },
  responses: {
    200: {
      description: 'The file, streamed',
      content: { [CONTENT_TYPE.jsonl]: { schema: binary }, [CONTENT_TYPE.parquet]: { schema: binary } },
    },
    ...problemResponses(401, 404, 409, 422, 503),
  },
});

export function registerExportRun(app: App) {
  app.openapi(route, async (c) => {
    const { format, filename, body } = await exportRun(c.get('deps'), c.req.valid('param').id, c.req.valid('query'));
    return c.body(Readable.toWeb(body) as ReadableStream, 200, {
      'content-type': CONTENT_TYPE[format],
      'content-disposition': `attachment; filename="${filename}"`,
      // Said outright, the headers go out at once and the body after them: an error in a later
      // shard then always cuts the body off, never turns the answer into a 500 before it begins.
      'transfer-encoding': 'chunked',
    }) as never;
  });
}
