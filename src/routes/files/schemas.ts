import { z } from '@hono/zod-openapi';
import type { FileRow } from '../../db/schema.js';

export const FileObject = z
  .object({
    id: z.string(),
    object: z.literal('file'),
    bytes: z.number().int(),
    filename: z.string(),
    purpose: z.string(),
    // Unix seconds, as OpenAI's File object has it (the official SDKs type it as a number).
    created_at: z.number().int().openapi({ description: 'Unix seconds', example: 1764684000 }),
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
    created_at: Math.floor(f.createdAt / 1000),
    status: 'processed' as const,
  };
}
