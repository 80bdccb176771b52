import { createRoute, z } from '@hono/zod-openapi';
import { eq } from 'drizzle-orm';
import type { App } from '../../http/app.js';
import { ApiError, notFound, problemResponses } from '../../errors.js';
import { getFile } from '../../db/files.js';
import { resolveBatchFile } from '../../runner/batch-files.js';
import { files, runs } from '../../db/schema.js';
import { FileIdParam, jsonContent } from '../common.js';
import { sql } from 'drizzle-orm';

const Deleted = z.object({ id: z.string(), object: z.literal('file'), deleted: z.literal(true) }).openapi('FileDeleted');

const route = createRoute({
  method: 'delete',
  path: '/v1/files/{id}',
  tags: ['files'],
  summary: 'Delete a file that no unfinished run still reads',
  request: { params: FileIdParam },
  responses: { 200: jsonContent(Deleted, 'The file is gone'), ...problemResponses(401, 404, 409, 422) },
});

export function registerDeleteFile(app: App) {
  app.openapi(route, async (c) => {
    const deps = c.get('deps');
    const { id } = c.req.valid('param');
    const file = getFile(deps.db, id);
    if (!file && resolveBatchFile(deps.db, id)) throw new ApiError('conflict', "a batch's output and error files are views of its run's shards and go with the run");
    if (!file) throw notFound('file', id);
    const reader = deps.db
      .select({ id: runs.id })
      .from(runs)
      .where(sql`json_extract(${runs.input}, '$.file_id') = ${id} and ${runs.status} = 'validating'`)
      .get();
    if (reader) throw new ApiError('conflict', `run ${reader.id} is still validating this file`);
    await deps.stores.forUri(deps.config.outputUri).delete(file.objectKey).catch((err: Error) => {
      deps.logger.warn({ file_id: id, err: { message: err.message } }, 'file object delete failed; row removed anyway');
    });
    deps.db.delete(files).where(eq(files.id, id)).run();
    return c.json({ id, object: 'file' as const, deleted: true as const }, 200);
  });
}
