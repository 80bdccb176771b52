import { z } from 'zod';
import { nestsDeeperThan, tooDeepMessage } from './json-depth.js';

// What a run (or one of its lines) may ask of the server. The routes give these schemas their
// OpenAPI names; ingest checks each line's own params against the same rules.

export const maxLen = (n: number) => z.string().max(n, `must be at most ${n} characters`);

export const Message = z.object({ role: z.string().min(1).max(64), content: z.unknown() }).catchall(z.unknown());

/**
 * The most answers a run may ask per input line (`params.n`). SGLang decodes them side by side in
 * one request, each holding KV for its own answer: past a few dozen, one request would take a
 * server's whole batch.
 */
export const MAX_SAMPLES_PER_LINE = 64;

/** OpenAI's API takes at most 4 stop strings; SGLang takes any number, and each is checked against every token decoded. */
export const MAX_STOP_STRINGS = 32;
/** An OpenAI function definition, as a Chat Completions body's `tools` holds it. */
export const ToolDefinition = z
  .object({
    type: z.literal('function'),
    function: z
      .object({
        name: z.string().min(1).max(128),
        description: z.string().optional(),
        parameters: z.record(z.string(), z.unknown()).optional(),
      })
      .catchall(z.unknown()),
  })
  .catchall(z.unknown());

/** Tools a request may offer: SGLang renders them all into the prompt, so a few hundred is already long. */
export const MAX_TOOLS = 512;

// Known sampling parameters are checked; anything else is passed through to SGLang untouched.
export const Params = z
  .object({
    temperature: z.number().min(0).max(2).optional(),
    top_p: z.number().gt(0).max(1).optional(),
    top_k: z.number().int().min(-1).max(100_000).optional(),
    min_p: z.number().min(0).max(1).optional(),
    max_tokens: z.number().int().min(1).max(10_000_000).optional(),
    seed: z
      .number()
      .int()
      .min(0)
      .max(2 ** 53)
      .optional(),
    stop: z.union([maxLen(1000), z.array(maxLen(1000)).max(MAX_STOP_STRINGS, `at most ${MAX_STOP_STRINGS} stop strings`)]).optional(),
    repetition_penalty: z.number().gt(0).max(10).optional(),
    frequency_penalty: z.number().min(-2).max(2).optional(),
    presence_penalty: z.number().min(-2).max(2).optional(),
    chat_template_kwargs: z.record(z.string(), z.unknown()).optional(),
    stream: z.literal(false, "stream is regen's to set: it streams by itself when quality.stop_loops is on").optional(),
    n: z.number().int().min(1).max(MAX_SAMPLES_PER_LINE, `must be at most ${MAX_SAMPLES_PER_LINE}`).optional(),
    tools: z.array(ToolDefinition).max(MAX_TOOLS, `must hold at most ${MAX_TOOLS} tools`).optional(),
    tool_choice: z
      .union([z.enum(['none', 'auto', 'required']), z.object({ type: z.literal('function'), function: z.object({ name: z.string().min(1) }) })])
      .optional(),
  })
  .catchall(z.unknown())
  .refine((p) => !('messages' in p) && !('model' in p), 'params must not contain messages or model')
  .refine((p) => !nestsDeeperThan(p), tooDeepMessage)
  .superRefine(refuseMisplaced);

/**
 * Params that SGLang would accept and silently ignore where they stand (it ignores unknown fields),
 * refused with where they belong: the run would otherwise go on as if they had not been asked for.
 */
function refuseMisplaced(params: Record<string, unknown>, ctx: z.RefinementCtx): void {
  const kwargs = params.chat_template_kwargs;
  if ('enable_thinking' in params) {
    const value = JSON.stringify(params.enable_thinking) ?? 'false';
    ctx.addIssue({
      code: 'custom',
      path: ['enable_thinking'],
      message: `belongs in chat_template_kwargs, as {"chat_template_kwargs": {"enable_thinking": ${value}}}: only those reach the chat template, and SGLang ignores it at the top level`,
    });
  }
  if ('extra_body' in params) {
    ctx.addIssue({
      code: 'custom',
      path: ['extra_body'],
      message:
        "is the OpenAI SDK's way of adding fields to a request: write its fields in params directly (e.g. params.chat_template_kwargs); SGLang ignores extra_body",
    });
  }
  // Qwen3's template turns thinking off only for `enable_thinking is false`: the string "false" would leave it on.
  if (
    typeof kwargs === 'object' &&
    kwargs !== null &&
    'enable_thinking' in kwargs &&
    typeof (kwargs as Record<string, unknown>).enable_thinking !== 'boolean'
  ) {
    ctx.addIssue({
      code: 'custom',
      path: ['chat_template_kwargs', 'enable_thinking'],
      message: 'must be true or false (a JSON boolean): the chat template reads anything else, the string "false" included, as thinking on',
    });
  }
}

export const QualitySettings = z.union([
  z.literal(false),
  z.object({
    min_completion_tokens: z.number().int().min(0).max(1_000_000).optional(),
    retry_flagged: z.number().int().min(0).max(10).optional(),
    gate: z
      .union([
        z.literal(false),
        z.object({
          min_samples: z.number().int().min(1).max(10_000_000).optional(),
          max_flag_rate: z.number().min(0).max(1).optional(),
        }),
      ])
      .optional(),
    stop_loops: z.boolean().optional(),
    // Runs with output.tokens: a generation with fewer generated ids, not cut by max_tokens, is flagged few_trainable (default 16; 0 turns it off).
    min_trainable_tokens: z.number().int().min(0).max(1_000_000).optional(),
  }),
]);
