import { z } from '@hono/zod-openapi';
import { CAP_SOURCES, endpointCap } from '../../domain/concurrency.js';
import { ENDPOINT_STATES, OPERATOR_ENDPOINT_STATES } from '../../domain/statuses.js';
import { hitRate, type CacheUsage } from '../../db/cache-usage.js';
import type { EndpointRow } from '../../db/schema.js';
import type { EndpointLive } from '../../domain/live-view.js';
import { HttpUrl, iso, Timestamp } from '../common.js';
import { HHMM, isTimeZone, lent, nextOpening, WEEKDAYS } from '../../domain/schedule.js';

export const EndpointUrl = HttpUrl.openapi({ example: 'http://10.0.0.5:30000' });

const Aliases = z
  .array(z.string().min(1).max(256))
  .max(16)
  .openapi({
    description: "Other model names the endpoint answers to, besides the one it serves (a run's model may be any of them)",
    example: ['Qwen/Qwen3-27B'],
  });

/** SGLang's `priority` is a Python int; this keeps it within what every store and server takes. */
const MAX_PRIORITY = 1_000_000;

const RequestPriority = z.number().int().min(-MAX_PRIORITY).max(MAX_PRIORITY).nullable().openapi({
  description:
    'Sent as SGLang\'s `priority` on every request regen sends here (a server launched with `--enable-priority-scheduling`); null sends none. Which value goes first is the server\'s `--schedule-low-priority-values-first` (docs/sglang.md "Priority")',
});

const BulkHeader = z.boolean().openapi({ description: 'Send `x-smg-priority: bulk` on every request: the SGLang model gateway sheds this class first' });

const Share = z
  .object({
    reserve_slots: z
      .number()
      .int()
      .min(0)
      .max(100_000)
      .openapi({ description: "Slots kept free for others: regen's cap is at most the server's slots less others' running requests less these" }),
    max_other_queue: z
      .number()
      .int()
      .min(0)
      .max(100_000)
      .openapi({ description: 'While others have more requests than this waiting, regen sends nothing new here' }),
  })
  .strict()
  .nullable()
  .openapi({ description: "Share the server with others' traffic (off when null): regen yields to others' load, read at every load reading" });

const Window = z
  .object({
    days: z.array(z.enum(WEEKDAYS)).min(1).max(7).optional().openapi({ description: 'The days it opens on (every day when absent)' }),
    from: z.string().regex(HHMM, 'must be HH:MM').openapi({ example: '20:00' }),
    to: z
      .string()
      .regex(HHMM, 'must be HH:MM')
      .openapi({ description: 'Not after `from`: the window crosses midnight and ends the next day', example: '07:00' }),
  })
  .strict()
  .refine((w) => w.from !== w.to, { message: 'from and to are the same: leave schedule null to lend the endpoint all day', path: ['to'] });

const Schedule = z
  .array(Window)
  .min(1)
  .max(64)
  .nullable()
  .openapi({
    description:
      'The windows in which regen may send work here, in `timezone`; null: always. Outside them nothing new is sent and what runs finishes (see drain_grace_ms)',
    example: [{ days: ['mon', 'tue', 'wed', 'thu', 'fri'], from: '20:00', to: '07:00' }],
  });

const TimeZone = z
  .string()
  .max(64)
  .refine(isTimeZone, 'must be an IANA time zone name, such as Europe/Paris or UTC')
  .openapi({ description: "The schedule's time zone (default UTC)" });

const LendUntil = z
  .string()
  .datetime({ offset: true, message: 'must be an RFC 3339 timestamp, such as 2026-12-07T06:00:00Z' })
  .nullable()
  .openapi({ description: 'From this moment regen sends nothing new here, until it is changed', format: 'date-time' });

const DrainGrace = z.number().int().min(0).max(86_400_000).nullable().openapi({
  description:
    'Off schedule or past lend_until, requests still running are cancelled (their samples go back to the queue) after this many ms; null: they finish',
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
    request_priority: RequestPriority.optional(),
    bulk_header: BulkHeader.optional(),
    share: Share.optional(),
    schedule: Schedule.optional(),
    timezone: TimeZone.optional(),
    lend_until: LendUntil.optional(),
    drain_grace_ms: DrainGrace.optional(),
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
    request_priority: RequestPriority.optional(),
    bulk_header: BulkHeader.optional(),
    share: Share.optional(),
    schedule: Schedule.optional(),
    timezone: TimeZone.optional(),
    lend_until: LendUntil.optional(),
    drain_grace_ms: DrainGrace.optional(),
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
    request_priority: z.number().int().nullable(),
    priority_refused_at: Timestamp.nullable().openapi({
      description:
        'When the server refused the `priority` field (it was launched without priority scheduling): regen sends none here since; setting request_priority again clears it',
    }),
    bulk_header: z.boolean(),
    share: z.object({ reserve_slots: z.number().int(), max_other_queue: z.number().int() }).nullable(),
    schedule: z.array(z.object({ days: z.array(z.enum(WEEKDAYS)).optional(), from: z.string(), to: z.string() })).nullable(),
    timezone: z.string(),
    lend_until: Timestamp.nullable(),
    drain_grace_ms: z.number().int().nullable(),
    off_schedule: z.boolean().openapi({ description: 'Outside its schedule or past lend_until: regen sends nothing new here' }),
    next_window_at: Timestamp.nullable().openapi({ description: 'Off schedule: when its next window opens; null past lend_until or with no window ahead' }),
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

export function renderEndpoint(e: EndpointRow, live: EndpointLive, defaultConcurrency: number, usage: readonly CacheUsage[], now: number) {
  const off = !lent(e, now);
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
    request_priority: e.requestPriority,
    priority_refused_at: iso(e.priorityRefusedAt),
    bulk_header: e.bulkHeader,
    share: e.share,
    schedule: e.schedule,
    timezone: e.timezone,
    lend_until: iso(e.lendUntil),
    drain_grace_ms: e.drainGraceMs,
    off_schedule: off,
    next_window_at: off ? iso(nextOpening(e, now)) : null,
    server: {
      running: live.server.running,
      queued: live.server.queued,
      token_usage: live.server.token_usage,
      cache_hit_rate: live.server.cache_hit_rate ?? null,
      read_at: iso(live.server.read_at),
    },
  };
}
