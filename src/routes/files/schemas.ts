import { z } from '@hono/zod-openapi';

export const FileObject = z
  .object({
    id: z.string(),
    object: z.literal('file'),
    bytes: z.number().int(),
    filename: z.string(),
    purpose: z.string(),
    // Unix seconds, as OpenAI's File object has it (the official SDKs type it as a number).
    created_at: z.number().int().openapi({ description: 'Unix seconds', example: 1764684000 }),
    expires_at: z.number().int().nullable().openapi({
      description:
        "Unix seconds: when the content is deleted (`expires_after`, or a batch output's `output_expires_after`); null when it is kept until deleted",
    }),
    expired: z.boolean().openapi({ description: "regen's addition: the content was deleted at expires_at; the object stays" }),
    status: z.literal('processed').openapi({ description: "Deprecated by OpenAI; kept for the SDKs' waitForProcessing" }),
    status_details: z.string().nullable(),
  })
  .openapi('File');
