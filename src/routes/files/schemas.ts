import { z } from '@hono/zod-openapi';
import type { FileRow } from '../../db/schema.js';
import { iso, Timestamp } from '../common.js';

export const FileObject = z
  .object({
    id: z.string(),
    object: z.literal('file'),
    bytes: z.number().int(),
    filename: z.string(),
    purpose: z.string(),
    created_at: Timestamp,
    // OpenAI clients wait for `processed` (files.waitForProcessing); a stored file is ready at once.
    status: z.literal('processed'),
  })
  .openapi('File');

export function renderFile(f: FileRow) {
  return {
    id: f.id,
    object: 'file' as const,
    bytes: f.bytes,
    filename: f.filename,
    purpose: f.purpose,
    created_at: iso(f.createdAt)!,
    status: 'processed' as const,
  };
}
