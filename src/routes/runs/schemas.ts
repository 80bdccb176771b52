import { z } from '@hono/zod-openapi';
import { SPLIT_NAMES } from '../../domain/assign.js';
import { FLAGS } from '../../domain/flags.js';
import { DEFAULT_CALIBRATION_SAMPLES, MAX_CALIBRATION_SAMPLES } from '../../domain/forecast.js';
import { nestsDeeperThan, tooDeepMessage } from '../../domain/json-depth.js';
import * as domain from '../../domain/params.js';
import {
  DISPATCH_ORDERS,
  HISTORY_REASONING,
  ON_INVALID_LINE,
  ON_LENGTH,
  REGENERATE_MODES,
  TOOL_MISMATCH_ACTIONS,
  TOOL_PAIRINGS,
} from '../../domain/run-settings.js';
import * as variants from '../../domain/variants.js';
import { RUN_STATUSES, SAMPLE_STATUSES, SHARD_STATUSES } from '../../domain/statuses.js';
import { Timestamp, WebhookTarget } from '../common.js';
import { DELIVERY_STATUSES } from '../../domain/webhooks.js';
import { OUTPUT_FORMATS } from '../../domain/output-format.js';
import { RUN_ENDPOINTS } from '../../domain/run-endpoint.js';

/** Requests given inline in the create body; a larger input is uploaded as a file, which streams. */
const MAX_INLINE_REQUESTS = 100_000;

/**
 * Names a schema src/domain made for the document. zod copies its methods onto each schema as it
 * makes it, so one made before @hono/zod-openapi extended zod (its module loaded first: the store's,
 * a bench's) has no `.openapi` of its own; the extension's method is taken from the prototype.
 */
function named<T extends z.ZodType>(schema: T, ...args: Parameters<T['openapi']>): T {
  return (z.ZodType.prototype.openapi as (...a: unknown[]) => T).apply(schema, args);
}

export const Message = named(domain.Message, 'ChatMessage');

export const Params = named(domain.Params, 'GenerationParams', {
  example: { temperature: 0.6, top_p: 0.95, max_tokens: 8192, chat_template_kwargs: { enable_thinking: true } },
});

export const QualitySettings = named(domain.QualitySettings, 'QualitySettings');

export const Variants = named(variants.Variants, 'Variants', {
  description:
    "Named params, each taken by a share of the samples in proportion to its weight, chosen by custom_id alone (the same input gets the same variant in every run). Params are laid run, variant, line; `n` is the run's only. Each output line names its `variant`",
  example: [
    { name: 'think', weight: 3, params: { chat_template_kwargs: { enable_thinking: true } } },
    { name: 'plain', weight: 1, params: { chat_template_kwargs: { enable_thinking: false } } },
  ],
});

export const CreateRunBody = z
  .object({
    name: domain.maxLen(256).optional(),
    model: z.string().min(1, 'must not be empty').max(256, 'must be at most 256 characters'),
    input: z.union(
      [
        z.object({ file_id: z.string().min(1).max(128) }).strict(),
        z.object({ uri: z.string().min(1).max(4096) }).strict(),
        z
          .object({
            requests: z
              .array(z.unknown().refine((r) => !nestsDeeperThan(r), tooDeepMessage))
              .min(1, 'must hold at least one request')
              .max(MAX_INLINE_REQUESTS, `at most ${MAX_INLINE_REQUESTS.toLocaleString('en')} requests inline: upload a larger input as a file (input.file_id)`),
          })
          .strict(),
      ],
      { error: 'expected exactly one of {"file_id"}, {"uri"} or {"requests"}' },
    ),
    endpoint: z.enum(RUN_ENDPOINTS).optional().openapi({
      description:
        "The server route each request goes to: `/v1/chat/completions` (the default: lines carry messages), `/v1/completions` (a line's `prompt`, text or token ids, sent raw with no chat template; output lines carry `text`) or `/v1/embeddings` (a line's `input`; output lines carry `embedding`, floats, or base64 with `params.encoding_format`). Such runs write `jsonl` or `parquet` (the embedding as list<float32>); a regen process holds an embeddings run's vectors to one size (the `dimensions` asked, else the first it reads; per process)",
    }),
    params: Params.optional(),
    shard_size: z.number().int().min(1).max(100_000).optional(),
    output: z
      .object({
        // An S3 key is at most 1,024 bytes; the unique index on it (PostgreSQL's btree) takes at most 2,704.
        uri: z.string().min(1).max(1024).optional(),
        format: z.enum(OUTPUT_FORMATS).optional().openapi({
          description:
            "How the shards are written: `jsonl` (the default: one output line per sample), `conversations` (SpecForge's regenerated-data shape: the conversation with each answer's reasoning, and `status`), or `parquet` (typed Parquet shards with a `README.md` dataset card for Hugging Face `datasets`)",
        }),
        expires_after: z.object({ seconds: z.number().int() }).strict().optional().openapi({
          description:
            "Deletes the run's output (shards, error files, manifest, card) this many seconds after the run finishes: 3600 to 2592000 (30 days). The run stays, `output_expired: true`",
        }),
        overwrite: z.boolean().optional().openapi({
          description:
            "Lets the run replace files of the names it writes (`shard-*`, `manifest.json`, `README.md` where it writes a card, `train/`, `eval/`, `tokens/`, `export*`) that its prefix already holds; without it such a prefix is a 409 naming the file. A prefix holding the run's input is refused either way",
        }),
        tokens: z.boolean().optional().openapi({
          description:
            "Also writes training rows under `tokens/` (mirroring the text shards, JSONL or Parquet by `format`): per kept generation the server's own `input_ids` (prompt then generated) and a `loss_mask` (0 over the prompt, 1 over the generated ids), with `num_trainable`. Only endpoints that return token ids serve such a run",
        }),
      })
      .strict()
      .optional(),
    split: z
      .object({
        eval: z.number().gt(0, 'must be more than 0').lt(1, 'must be less than 1').openapi({
          description: 'The share of samples written under `eval/`, chosen by a stable hash of the custom_id; the rest go under `train/`',
        }),
      })
      .strict()
      .optional()
      .openapi({ description: 'Splits the output into `train/` and `eval/`, each with its own shards; without it the shards sit at the prefix' }),
    regenerate: z.enum(REGENERATE_MODES).nullable().optional(),
    tool_pairing: z.enum(TOOL_PAIRINGS).optional().openapi({
      description:
        '`regenerate: "all_assistant"`: the target\'s call n of a step is paired with the source\'s call n of the same step; `name` (the default) asks the same function name too, `position` any',
    }),
    on_tool_mismatch: z.enum(TOOL_MISMATCH_ACTIONS).optional().openapi({
      description:
        '`regenerate: "all_assistant"`: a step that cannot be paired with the source\'s: `truncate` (the default: the line is kept up to its last complete user turn, flagged `tool_mismatch`; failed `tool_mismatch` when no turn is complete) or `fail`',
    }),
    history_reasoning: z.enum(HISTORY_REASONING).optional().openapi({
      description:
        '`regenerate: "all_assistant"`: which assistant messages of the history are sent with their `reasoning_content`: `loop` (the default: those of the current tool loop, after the last user message), `all` or `none`',
    }),
    on_invalid_line: z.enum(ON_INVALID_LINE).optional(),
    quality: QualitySettings.optional(),
    variants: Variants.optional(),
    on_length: z.enum(ON_LENGTH).optional().openapi({
      description:
        'An answer cut by max_tokens (finish_reason `length`): `keep` (the default: kept, flagged `truncated`), `retry` (asked again with max_tokens doubled, up to what the context leaves after the prompt, then failed `length_exhausted`), or `fail` (failed `truncated` at once). For thinking models, `retry` or `fail`: a cut chain of thought is a bad training sample',
    }),
    priority: z.number().int().min(-1000).max(1000).optional(),
    metadata: z
      .record(domain.maxLen(64), domain.maxLen(512))
      .refine((m) => Object.keys(m).length <= 16, 'at most 16 keys')
      .optional(),
    request_timeout_ms: z.number().int().min(1000).max(86_400_000).optional(),
    max_attempts: z.number().int().min(1).max(100).optional(),
    webhook: WebhookTarget.optional(),
    calibration: z
      .object({
        samples: z
          .number()
          .int()
          .min(0)
          .max(MAX_CALIBRATION_SAMPLES)
          .openapi({
            description: `Samples spread over the whole input (one at random in each of as many equal strata) answered first, for the forecast; 0 turns the slice off. Default ${DEFAULT_CALIBRATION_SAMPLES}, at most the input's size`,
          }),
      })
      .strict()
      .optional(),
    dispatch_order: z.enum(DISPATCH_ORDERS).optional().openapi({
      description:
        'After the calibration slice: `input` order, or `length_aware`: the samples whose old assistant turn is longest (a conversation: its old assistant turns together) go first, within two shards of the oldest open sample, meant to end the run flat. Default: `length_aware` for `regenerate: "all_assistant"` (the longest chains of turns start first, so the run does not end on a few long conversations), `input` otherwise',
    }),
    dry_run: z.boolean().optional().openapi({
      description:
        'Answer only the calibration slice, then end (`completed`, the other samples `cancelled`) with the forecast for the whole input on the current fleet',
    }),
    deadline_seconds: z
      .number()
      .int()
      .min(1)
      .max(365 * 86_400)
      .optional()
      .openapi({
        description: 'When the run should be done, counted from its start: the forecast then says how many endpoints like the current ones would meet it',
      }),
  })
  .strict()
  .openapi('CreateRun', {
    example: {
      name: 'regen-qwen3',
      model: 'Qwen/Qwen3-27B',
      input: { file_id: 'file_0mip2k3a1f3a9c0e1b2d4c6e8' },
      params: { temperature: 0.6, max_tokens: 8192, chat_template_kwargs: { enable_thinking: true } },
      regenerate: 'last_assistant',
    },
  });
export type CreateRunBody = z.infer<typeof CreateRunBody>;

export const ValidateRunBody = CreateRunBody.partial({ input: true }).openapi('ValidateRun', {
  description: 'A run as for `POST /v1/runs`; `input` may be left out, to check the rest before uploading the input file',
});

export const RunWarning = z
  .object({
    code: z.enum(['model_not_served', 'quality_over_limit']).openapi({
      description:
        "`model_not_served`: no endpoint serves the run's model; `quality_over_limit`: the run completed with a flagged share over the gate's limit (judged as a whole at its end, so a run shorter than the gate's `min_samples` is judged too)",
    }),
    field: z.string().openapi({ description: 'The request field the warning is about' }),
    message: z.string(),
    suggestions: z.array(z.string()).optional().openapi({
      description: '`model_not_served`: the served model names closest to the one asked for, best first (whole names and last path segments compared)',
    }),
  })
  .openapi('RunWarning', { description: 'Something that looks wrong but did not stop the run' });

export const RunValidation = z
  .object({
    object: z.literal('run.validation'),
    warnings: z.array(RunWarning),
  })
  .openapi('RunValidation', { description: 'The body would create a run; nothing was stored' });

const counts = (keys: readonly string[]) => z.object(Object.fromEntries(keys.map((k) => [k, z.number().int()])));

export const RunStatus = z.enum(RUN_STATUSES).openapi('RunStatus');

export const RunWebhook = z
  .object({
    url: z.string().openapi({
      description:
        "The run's own webhook URL; for the server's default, its origin only: such a URL often carries a token, and it is the operator's, not the caller's",
    }),
    source: z
      .enum(['run', 'server'])
      .openapi({ description: "`run`: the run's own webhook; `server`: the server's default (REGEN_WEBHOOK_URL), signed with the server's key" }),
    secret_set: z.literal(true).openapi({ description: 'Every webhook has a secret; it is never returned' }),
    deliveries: counts(DELIVERY_STATUSES).openapi({ description: "The run's events by delivery status" }),
    last_error: z.string().nullable().openapi({ description: 'What the last failed attempt met; null once an attempt succeeds' }),
  })
  .openapi('RunWebhook', { description: "Where the run's events go and how their delivery stands; null when they go nowhere" });
const seconds = (description: string) => z.number().nullable().openapi({ description });

export const Forecast = z
  .object({
    computed_at: Timestamp,
    based_on_samples: z.number().int().openapi({
      description:
        'Calibration answers the forecast rests on: every answered sample of the slice, so it never falls as the run goes (the remaining mean length uses those ahead of the dispatch frontier); completed samples when the run has no slice',
    }),
    completion_tokens_estimate: z.number().int().openapi({ description: 'Completion tokens of the whole run: generated so far plus the estimate of the rest' }),
    completion_tokens_remaining: z.number().int(),
    wall_seconds_estimate: seconds('Wall time of the whole run on the current fleet; null until the fleet has a measured rate'),
    wall_seconds_remaining: seconds('Remaining completion tokens over the fleet’s measured token rate, each endpoint at its cap'),
    low: seconds('5th percentile of wall_seconds_remaining, from a bootstrap over the calibration lengths'),
    high: seconds('95th percentile of wall_seconds_remaining'),
    finishes_at: Timestamp.nullable(),
    endpoints_for_deadline: z
      .number()
      .int()
      .nullable()
      .openapi({ description: 'Endpoints like the current ones that would finish within deadline_seconds; null without a deadline, a rate, or time left' }),
    fleet: z.object({ endpoints: z.number().int(), completion_tokens_per_second: z.number() }),
  })
  .openapi('Forecast');

export const RunVariant = z
  .object({
    name: z.string(),
    weight: z.number(),
    params: z.record(z.string(), z.unknown()),
    effective_params: z.record(z.string(), z.unknown()).openapi({
      description:
        "The run's params with the variant's laid over them (chat_template_kwargs merged one level deep): what its samples are sent, but for a line's own params",
    }),
    request_counts: counts(['total', 'completed', 'failed']),
    quality: z.object({ flagged: z.number().int(), by_flag: counts(FLAGS) }),
    usage: counts(['prompt_tokens', 'completion_tokens', 'reasoning_tokens', 'cached_tokens']),
    cache_hit_rate: z.number().nullable().openapi({
      description: "The variant's answers' `cached_tokens` over their prompt tokens, as the run's `cache_hit_rate`; null before any answer",
    }),
  })
  .openapi('RunVariant', { description: 'A variant of a run: its samples (chosen by custom_id), how many are done, their flags and usage' });

const SpreadSchema = z
  .object({ rows: z.number().int(), min: z.number().int(), p5: z.number().int(), median: z.number().int(), p95: z.number().int(), max: z.number().int() })
  .nullable()
  .openapi('TrainableSpread', { description: "min, p5, median, p95 and max of the rows' trainable tokens (nearest rank); null with no rows" });

const TrainableSpreadSchema = z.object({ overall: SpreadSchema, variants: z.record(z.string(), SpreadSchema) }).openapi('TrainableSpreads');

export const Run = z
  .object({
    id: z.string(),
    object: z.literal('run'),
    name: z.string().nullable(),
    model: z.string(),
    status: RunStatus,
    status_reason: z.string().nullable(),
    created_at: Timestamp,
    started_at: Timestamp.nullable(),
    finished_at: Timestamp.nullable(),
    params: z.record(z.string(), z.unknown()),
    shard_size: z.number().int(),
    output_uri: z.string(),
    output_format: z.enum(OUTPUT_FORMATS),
    output_expires_at: Timestamp.nullable().openapi({
      description: 'When the output is deleted (`output.expires_after` from the finish); null when it is kept',
    }),
    output_expired: z.boolean().openapi({ description: 'The output was deleted at output_expires_at; the run and its samples stay' }),
    output_tokens: z.boolean().openapi({ description: 'Whether the run writes training rows of token ids under `tokens/` (`output.tokens`)' }),
    output_overwrite: z
      .boolean()
      .openapi({ description: 'Whether the run may replace files of the names it writes that its prefix held when it was created (`output.overwrite`)' }),
    split: z.object({ eval: z.number() }).nullable(),
    priority: z.number().int(),
    metadata: z.record(z.string(), z.string()),
    input: z.record(z.string(), z.unknown()),
    endpoint: z.enum(RUN_ENDPOINTS),
    regenerate: z.string().nullable(),
    tool_pairing: z.enum(TOOL_PAIRINGS).nullable().openapi({ description: 'A run with `regenerate: "all_assistant"`: its pairing rule; null for other runs' }),
    on_tool_mismatch: z.enum(TOOL_MISMATCH_ACTIONS).nullable(),
    history_reasoning: z.enum(HISTORY_REASONING).nullable(),
    on_invalid_line: z.enum(ON_INVALID_LINE),
    request_timeout_ms: z.number().int(),
    max_attempts: z.number().int(),
    quality_settings: z.unknown(),
    invalid_lines: z.object({
      count: z.number().int(),
      errors: z.array(z.object({ line: z.number().int(), message: z.string(), custom_id: z.string().optional() })),
    }),
    request_counts: counts(['total', 'pending', 'in_progress', 'completed', 'failed', 'cancelled']),
    turns: counts(['total', 'completed', 'in_flight', 'failed', 'tool_steps']).nullable().openapi({
      description:
        'A run with `regenerate: "all_assistant"`: its conversations\' requests, one a user turn and one a tool-call step (`request_counts` counts conversations). `total` once validated, the source\'s count of requests (an estimate for agentic conversations: the target may take more or fewer steps); `completed`, the requests answered; `in_flight`, the requests sent and not yet answered, as `progress.in_flight` counts them (the conversations under way, claimed ahead included, are `request_counts.in_progress`); `failed`, the requests that failed their conversation; `tool_steps`, the answered requests that called tools. Null for other runs',
    }),
    quality: z.object({ flagged: z.number().int(), by_flag: counts(FLAGS) }),
    usage: counts(['prompt_tokens', 'completion_tokens', 'reasoning_tokens']),
    cache_hit_rate: z.number().nullable().openapi({
      description:
        "Prefix-cache hit rate of the run's answers: their `cached_tokens` over their prompt tokens (0 when the servers run without `--enable-cache-report`); null before any answer",
    }),
    num_trainable: TrainableSpreadSchema.nullable().optional().openapi({
      description:
        "On GET of one run with `output.tokens`: the spread of the training rows' trainable tokens (the loss mask's 1s) over the shards written so far, overall and per variant; null for a run without `output.tokens`",
    }),
    cache_by_endpoint: z
      .array(
        z.object({
          endpoint_id: z.string(),
          endpoint_name: z.string().nullable().openapi({ description: "The endpoint's name; null once it is deleted" }),
          prompt_tokens: z.number().int(),
          cached_tokens: z.number().int(),
          cache_hit_rate: z.number().nullable(),
        }),
      )
      .optional()
      .openapi({ description: 'On GET of one run: the same by the endpoint that answered' }),
    shards: counts(['total', 'uploaded']),
    progress: z.object({
      fraction: z.number(),
      samples_per_second: z.number().openapi({
        description:
          'Samples completed per second: over the last minute while the run is worked on, its average over `elapsed_seconds` once it has finished, 0 while paused',
      }),
      completion_tokens_per_second: z.number().openapi({ description: 'Completion tokens per second, over the same time as `samples_per_second`' }),
      turns_per_second: z.number().nullable().openapi({
        description:
          'A conversation run (`regenerate: "all_assistant"`): its requests (`turns`: user turns and tool-call steps) answered per second, over the same time as `samples_per_second`, which counts its conversations. Null for other runs',
      }),
      requests_per_second: z.number().nullable().openapi({
        description:
          "A run with `params.n` > 1: its requests answered per second, each answering a line's n samples (`samples_per_second` ÷ n), over the same time. Null for other runs",
      }),
      eta_seconds: z.number().nullable(),
      elapsed_seconds: z.number().openapi({ description: 'From the start to now, or to the finish once the run has finished' }),
      in_flight: z.number().int().openapi({
        description:
          'Requests sent to an endpoint and not yet answered: never more than the caps allow. `request_counts.in_progress` counts the samples they answer (`samples_in_flight`) and those claimed ahead of dispatch',
      }),
      samples_in_flight: z.number().int().openapi({
        description:
          "The samples the requests in flight answer: with `params.n` > 1 one request asks for a line's n answers, so this is up to n × `in_flight`; equal to `in_flight` otherwise",
      }),
      turned_away: z.number().int().openapi({
        description:
          'Requests endpoints turned away for a while (429, a gateway shedding bulk traffic): their samples went back to the queue with no attempt charged. Counted while the run is dispatched, by the processes dispatching it now',
      }),
      without_ids: z.array(z.object({ endpoint_id: z.string(), name: z.string(), reason: z.string() })).openapi({
        description:
          'A run with `output.tokens`, while dispatched: the endpoints serving its model that it is not sent to because they return no token ids (they keep serving other runs), and why; empty otherwise. With none left the run waits, its `status_reason` says so',
      }),
    }),
    manifest_uri: z.string().nullable(),
    card_uri: z.string().nullable().openapi({
      description:
        "Where the run's dataset card (`README.md`, for Hugging Face `datasets`) is written as the run finishes: a run in Parquet or SpecForge's format, with a split or with `output.tokens`. Null for a run that writes none",
    }),
    webhook: RunWebhook.nullable(),
    calibration: z.object({ samples: z.number().int() }),
    dry_run: z.boolean(),
    dispatch_order: z.enum(DISPATCH_ORDERS),
    deadline_seconds: z.number().int().nullable(),
    forecast: Forecast.nullable(),
    on_length: z.enum(ON_LENGTH),
    variants: z.array(RunVariant).nullable().openapi({ description: "The run's variants with their counts, usage and quality; null when it has none" }),
    warnings: z.array(RunWarning).optional().openapi({
      description:
        'What looks wrong but did not stop the run: on the answer to the create request, a model no endpoint serves; on a completed run, a flagged share over the limit. Absent when there is none',
    }),
  })
  .openapi('Run');
export type Run = z.infer<typeof Run>;

export const SampleStatus = z.enum(SAMPLE_STATUSES).openapi('SampleStatus');
export const Flag = z.enum(FLAGS).openapi('QualityFlag');

export const Sample = z
  .object({
    object: z.literal('sample'),
    custom_id: z.string(),
    sample_index: z.number().int().openapi({ description: "Which of its line's params.n answers (0…n−1); 0 when the run asks one" }),
    run_id: z.string(),
    index: z.number().int(),
    shard: z.number().int(),
    status: SampleStatus,
    attempts: z.number().int().openapi({ description: 'Times the sample was sent, the ones that met a server fault included' }),
    server_faults: z.number().int().openapi({
      description: "Sends that met the server's fault (connection, timeout, 5xx, abort): they do not count against max_attempts",
    }),
    endpoint_id: z.string().nullable(),
    finish_reason: z.string().nullable(),
    usage: z
      .object({ prompt_tokens: z.number().int(), completion_tokens: z.number().int(), reasoning_tokens: z.number().int(), cached_tokens: z.number().int() })
      .nullable(),
    latency_ms: z.number().int().nullable(),
    flags: z.array(Flag),
    error: z.object({ code: z.string(), message: z.string(), status: z.number().int().nullable() }).nullable(),
    output_key: z.string().nullable(),
    output_line: z.number().int().nullable(),
    completed_at: Timestamp.nullable(),
    turn: z.number().int().nullable().openapi({
      description:
        'A conversation\'s (`regenerate: "all_assistant"`): the assistant turn being asked, or the one that failed it (0-based); null for other samples',
    }),
    turns_answered: z.number().int().nullable().openapi({
      description: 'A conversation\'s (`regenerate: "all_assistant"`): its requests answered so far (user turns and tool-call steps); null for other samples',
    }),
    variant: z.string().nullable().openapi({ description: "The name of the sample's variant; null when the run has none" }),
  })
  .openapi('Sample');

export const SampleTurn = z
  .object({
    index: z.number().int().openapi({ description: "The request's place in the conversation, 0-based" }),
    turn: z.number().int().openapi({ description: 'The user turn it answers, 0-based' }),
    step: z.number().int().openapi({ description: "Its place in its user turn: 0 for the turn's first request, one more per tool-call step before it" }),
    tool_calls: z.array(z.unknown()).nullable().openapi({ description: "The target's calls when the answer was a tool-call step; null for a text answer" }),
    content: z.string().nullable(),
    reasoning_content: z.string().nullable(),
    finish_reason: z.string().nullable(),
    usage: z.object({
      prompt_tokens: z.number().int(),
      completion_tokens: z.number().int(),
      reasoning_tokens: z.number().int(),
      cached_tokens: z.number().int(),
    }),
    endpoint_id: z.string().nullable(),
    latency_ms: z.number().int(),
    attempts: z.number().int(),
    flags: z.array(Flag),
  })
  .openapi('SampleTurn');

export const SampleDetail = Sample.extend({
  messages: z.array(Message),
  params: z.record(z.string(), z.unknown()).nullable().openapi({ description: "The line's own params (the run's and its variant's are on the run)" }),
  metadata: z
    .record(z.string(), z.unknown())
    .nullable()
    .openapi({ description: "The input line's own fields, as its output line carries them; null when it had none" }),
  output: z.object({ reasoning_content: z.string().nullable(), content: z.string().nullable() }).nullable(),
  trainable_tokens: z.number().int().nullable().openapi({
    description:
      "A completed sample of a run with `output.tokens`: the generated token ids its training rows train on (their loss masks' 1s, every kept turn and step of a conversation); null otherwise",
  }),
  turns: z
    .array(SampleTurn)
    .optional()
    .openapi({ description: "A conversation's answered turns, in order (the stored messages are its system and user turns)" }),
  conversation: z
    .array(z.object({ role: z.string(), request: z.number().int().optional() }).passthrough())
    .optional()
    .openapi({
      description:
        "A conversation's regenerated messages in order, as its output line will hold them: system and user turns, each answered request (`request`, its index in `turns`) with its reasoning and tool calls, and the source's tool results paired with the target's call ids",
    }),
  split: z.enum(SPLIT_NAMES).nullable().openapi({ description: "The split the sample's line is written to; null when the run has no split" }),
  shard_key: z.string().openapi({ description: "The object, under the run's output prefix, that holds (or will hold) the sample's line" }),
}).openapi('SampleDetail');

export const Shard = z
  .object({
    object: z.literal('shard'),
    index: z.number().int(),
    status: z.enum(SHARD_STATUSES),
    split: z.enum(['train', 'eval']).nullable().openapi({ description: 'The split whose samples the shard holds; null when the run has no split' }),
    samples: z.number().int(),
    done: z.number().int(),
    key: z.string().nullable(),
    bytes: z.number().int().nullable(),
    lines: z.number().int().nullable(),
    sha256: z.string().nullable(),
    errors_key: z.string().nullable(),
    errors_lines: z.number().int().nullable(),
    upload_attempts: z.number().int(),
    last_error: z.string().nullable(),
    uploaded_at: Timestamp.nullable(),
  })
  .openapi('Shard');
