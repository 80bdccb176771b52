import { z } from '@hono/zod-openapi';
import { CAP_SOURCES, endpointCap } from '../../domain/concurrency.js';
import { ENDPOINT_STATES, OPERATOR_ENDPOINT_STATES } from '../../domain/statuses.js';
import { hitRate, type CacheUsage } from '../../db/cache-usage.js';
import type { EndpointRow } from '../../db/schema.js';
import type { EndpointLive } from '../../domain/live-view.js';
import { HttpUrl, iso, Timestamp } from '../common.js';

export const EndpointUrl = HttpUrl.openapi({ example: 'http://10.0.0.5:30000' });

const Aliases = z
  .array(z.string().min(1).max(256))
  .max(16)
  .openapi({
    description: "Other model names the endpoint answers to, besides the one it serves (a run's model may be any of them)",
    example: ['Qwen/Qwen3-27B'],
  });

const Labels = z.record(z.string().max(64), z.string().max(256)).refine((l) => Object.keys(l).length <= 32, 'at most 32 labels');

export const CreateEndpointBody = z
  .object({
    url: EndpointUrl,
    name: z.string().min(1).max(128).optional(),
    api_key: z.string().min(1).max(4096).optional().openapi({ description: 'Write-only: stored, used, never returned' }),
    max_concurrency: z.number().int().min(1).max(100_000).optional(),
    weight: z.number().gt(0).max(1000).optional(),
    labels: Labels.optional(),
    aliases: Aliases.optional(),
  })
  .strict()
  .openapi('CreateEndpoint', { example: { url: 'http://10.0.0.5:30000', name: 'node-a', max_concurrency: 64 } });

export const PatchEndpointBody = z
  .object({
    name: z.string().min(1).max(128).optional(),
    max_concurrency: z.number().int().min(1).max(100_000).nullable().optional(),
    weight: z.number().gt(0).max(1000).optional(),
    state: z.enum(OPERATOR_ENDPOINT_STATES).optional(),
    api_key: z.string().min(1).max(4096).nullable().optional(),
    labels: Labels.optional(),
    aliases: Aliases.optional(),
  })
  .strict()
  .openapi('PatchEndpoint');

export const Endpoint = z
  .object({
    id: z.string(),
    object: z.literal('endpoint'),
    url: z.string(),
    name: z.string(),
    model: z.string().nullable(),
    state: z.enum(ENDPOINT_STATES),
    max_concurrency: z.number().int().openapi({ description: 'The cap in use: never more requests in flight than this' }),
    max_concurrency_source: z.enum(CAP_SOURCES).openapi({
      description:
        "user: the operator's max_concurrency; adaptive: steered from the server's live load (never above the operator's value); server: the server's running limit; default: REGEN_DEFAULT_CONCURRENCY",
    }),
    aliases: z.array(z.string()),
    capacity: z.object({
      max_running: z
        .number()
        .int()
        .nullable()
        .openapi({ description: "What the server can run at once (the sum over its DP ranks of SGLang's effective limit)" }),
      kv_tokens: z.number().int().nullable().openapi({ description: "The server's KV pool in tokens (max_total_num_tokens)" }),
      max_model_len: z.number().int().nullable().openapi({ description: 'The context length the server serves' }),
    }),
    in_flight: z.number().int(),
    weight: z.number(),
    has_api_key: z.boolean(),
    labels: z.record(z.string(), z.string()),
    last_error: z.string().nullable(),
    last_checked_at: Timestamp.nullable(),
    created_at: Timestamp,
    stats: z.object({
      completed: z.number().int(),
      failed: z.number().int(),
      samples_per_second: z.number(),
      completion_tokens_per_second: z.number(),
      p50_latency_ms: z.number().nullable(),
      prompt_tokens: z.number().int().openapi({ description: 'Prompt tokens of the answers it gave, every run' }),
      cached_tokens: z.number().int().openapi({ description: "Of those, the tokens its prefix cache served (the answers' `cached_tokens`)" }),
      cache_hit_rate: z.number().nullable().openapi({
        description: 'cached_tokens ÷ prompt_tokens: the prefix-cache hit rate regen saw; 0 when the server runs without `--enable-cache-report`',
      }),
    }),
    server: z.object({
      running: z.number().nullable(),
      queued: z.number().nullable(),
      token_usage: z.number().nullable(),
      cache_hit_rate: z
        .number()
        .nullable()
        .openapi({ description: "The server's own prefix-cache hit rate (`cache_hit_rate` of /v1/loads, `sglang:cache_hit_rate`), when it says" }),
      read_at: Timestamp.nullable().openapi({
        description: 'When these figures were read from the server: they are its last known load, and grow old while the server does not answer',
      }),
    }),
  })
  .openapi('Endpoint');

export function renderEndpoint(e: EndpointRow, live: EndpointLive, defaultConcurrency: number, usage: readonly CacheUsage[]) {
  const cache = usage.find((u) => u.endpointId === e.id) ?? { promptTokens: 0, cachedTokens: 0 };
  const cap = endpointCap(e, live, defaultConcurrency);
  return {
    id: e.id,
    object: 'endpoint' as const,
    url: e.url,
    name: e.name,
    model: e.model,
    state: e.state as (typeof ENDPOINT_STATES)[number],
    max_concurrency: cap.cap,
    max_concurrency_source: cap.source,
    aliases: e.aliases,
    capacity: { max_running: e.serverMaxRunning, kv_tokens: e.kvTokens, max_model_len: e.maxModelLen },
    in_flight: live.in_flight,
    weight: e.weight,
    has_api_key: e.apiKey != null,
    labels: e.labels,
    last_error: e.lastError,
    last_checked_at: iso(e.lastCheckedAt),
    created_at: iso(e.createdAt)!,
    stats: {
      completed: e.completed,
      failed: e.failed,
      samples_per_second: live.samples_per_second,
      completion_tokens_per_second: live.completion_tokens_per_second,
      p50_latency_ms: live.p50_latency_ms,
      prompt_tokens: cache.promptTokens,
      cached_tokens: cache.cachedTokens,
      cache_hit_rate: hitRate(cache),
    },
    server: {
      running: live.server.running,
      queued: live.server.queued,
      token_usage: live.server.token_usage,
      cache_hit_rate: live.server.cache_hit_rate ?? null,
      read_at: iso(live.server.read_at),
    },
  };
}
