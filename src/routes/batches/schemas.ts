import { z } from '@hono/zod-openapi';
import { WebhookTarget } from '../common.js';
import { RUN_ENDPOINTS, unsupportedEndpointMessage } from '../../domain/run-endpoint.js';

const maxLen = (n: number) => z.string().max(n, `must be at most ${n} characters`);

export const BATCH_STATUSES = ['validating', 'failed', 'in_progress', 'finalizing', 'completed', 'expired', 'cancelling', 'cancelled'] as const;
export const BatchStatus = z.enum(BATCH_STATUSES).openapi('BatchStatus');

export const BatchIdParam = z.object({
  id: z
    .string()
    .max(128)
    .regex(/^[A-Za-z0-9_-]+$/, 'batch ids contain only letters, digits, "_" and "-"')
    .openapi({ param: { name: 'id', in: 'path' }, example: 'batch_0mip2k3a1f3a9c0e1b2d4c6e8' }),
});

export const CreateBatchBody = z
  .object({
    input_file_id: z.string().min(1).max(128),
    endpoint: z.enum(RUN_ENDPOINTS, { error: (issue) => unsupportedEndpointMessage(String(issue.input)) }),
    // OpenAI takes "24h" only; longer windows suit regen's multi-day runs.
    completion_window: z.string().regex(/^[1-9][0-9]{0,3}h$/, 'expected a whole number of hours, such as "24h"'),
    metadata: z
      .record(maxLen(64), maxLen(512))
      .refine((m) => Object.keys(m).length <= 16, 'at most 16 keys')
      .nullable()
      .optional(),
    // Its bounds (3600 s to 30 days) are checked by the service, where a test setting may lower the minimum.
    output_expires_after: z
      .object({ anchor: z.literal('created_at'), seconds: z.number().int() })
      .strict()
      .optional()
      .openapi({
        description:
          "Deletes the batch's output and error files (its run's shards) this many seconds after they are made, when the batch ends: 3600 to 2592000 (30 days)",
      }),
    webhook: WebhookTarget.optional(),
  })
  .strict()
  .openapi('CreateBatch', {
    example: { input_file_id: 'file_0mip2k3a1f3a9c0e1b2d4c6e8', endpoint: '/v1/chat/completions', completion_window: '24h', metadata: { team: 'data' } },
  });
export type CreateBatchBody = z.infer<typeof CreateBatchBody>;

const unixTime = z.number().int().nullable().openapi({ description: 'Unix seconds' });

export const BatchError = z
  .object({ code: z.string(), line: z.number().int().nullable(), message: z.string(), param: z.string().nullable() })
  .openapi('BatchError');

export const Batch = z
  .object({
    id: z.string(),
    object: z.literal('batch'),
    endpoint: z.string(),
    model: z.string(),
    errors: z.object({ object: z.literal('list'), data: z.array(BatchError) }).nullable(),
    input_file_id: z.string(),
    completion_window: z.string(),
    status: BatchStatus,
    output_file_id: z.string().nullable(),
    error_file_id: z.string().nullable(),
    created_at: z.number().int().openapi({ description: 'Unix seconds' }),
    in_progress_at: unixTime,
    expires_at: unixTime,
    finalizing_at: unixTime,
    completed_at: unixTime,
    failed_at: unixTime,
    expired_at: unixTime,
    cancelling_at: unixTime,
    cancelled_at: unixTime,
    request_counts: z.object({ total: z.number().int(), completed: z.number().int(), failed: z.number().int() }),
    usage: z
      .object({
        input_tokens: z.number().int(),
        input_tokens_details: z.object({ cached_tokens: z.number().int() }),
        output_tokens: z.number().int(),
        output_tokens_details: z.object({ reasoning_tokens: z.number().int() }),
        total_tokens: z.number().int(),
      })
      .openapi({ description: 'The tokens of every answer the batch has had, those the quality checks retried included' }),
    metadata: z.record(z.string(), z.string()).nullable(),
  })
  .openapi('Batch');
export type Batch = z.infer<typeof Batch>;

export const BatchList = z
  .object({
    object: z.literal('list'),
    data: z.array(Batch),
    first_id: z.string().nullable(),
    last_id: z.string().nullable(),
    has_more: z.boolean(),
  })
  .openapi('BatchList');
