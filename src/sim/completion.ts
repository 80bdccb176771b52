import { randomBytes } from 'node:crypto';
import { SimHttpError } from './http.js';
import { isRecord, type Knobs } from './options.js';
import { countPromptTokens, digestOf, fillerText, hashSeed, seededRandom } from './text.js';

/** Qwen's <|im_end|>: the token SGLang reports in `matched_stop` when generation stops on its own. */
const EOS_TOKEN_ID = 151645;

export interface ChatRequest {
  digest: string;
  promptTokens: number;
  maxTokens: number | undefined;
  thinking: boolean;
}

/** Checks a chat-completion body the way SGLang would, in the order it would complain. */
export function parseChatRequest(body: unknown, knobs: Knobs): ChatRequest {
  if (!isRecord(body)) throw new SimHttpError(400, 'The request body must be a JSON object.');
  if (body.stream === true) throw new SimHttpError(400, 'streaming is not supported by the simulator');
  const { messages, model } = body;
  if (!Array.isArray(messages) || messages.length === 0 || !messages.every(isRecord)) {
    throw new SimHttpError(400, '`messages` must be a non-empty array of message objects.');
  }
  if (model !== undefined && model !== knobs.model && model !== 'default') {
    throw new SimHttpError(404, `The model '${String(model)}' does not exist.`);
  }
  const maxTokens = body.max_completion_tokens ?? body.max_tokens ?? undefined;
  if (maxTokens !== undefined && !(Number.isInteger(maxTokens) && (maxTokens as number) > 0)) {
    throw new SimHttpError(400, '`max_tokens` must be a positive integer.');
  }
  const promptTokens = countPromptTokens(messages);
  if (promptTokens > knobs.contextLength) {
    throw new SimHttpError(400, `The input (${promptTokens} tokens) is longer than the model's context length (${knobs.contextLength} tokens).`);
  }
  const kwargs = body.chat_template_kwargs;
  return {
    digest: digestOf(messages),
    promptTokens,
    maxTokens: maxTokens as number | undefined,
    thinking: !(isRecord(kwargs) && kwargs.enable_thinking === false),
  };
}

interface Generated {
  reasoning: string | null;
  content: string;
  reasoningTokens: number;
  contentTokens: number;
  finishReason: 'stop' | 'length';
}

// The reply text depends only on the prompt and the simulator's seed, so a rerun reproduces it.
function generate(request: ChatRequest, knobs: Knobs): Generated {
  const budget = request.maxTokens ?? Infinity;
  const wantedReasoning = request.thinking ? knobs.reasoningTokens : 0;
  const reasoningTokens = Math.min(wantedReasoning, budget);
  const contentTokens = Math.min(knobs.completionTokens, budget - reasoningTokens);
  // Separate streams so a cut reasoning leaves the answer's words unchanged.
  const seed = `${request.digest}:${knobs.seed}`;
  return {
    reasoning: request.thinking ? fillerText(`Reasoning about ${request.digest}. `, reasoningTokens, seededRandom(hashSeed(`${seed}:reasoning`))) : null,
    content: fillerText(`Answer ${request.digest}: `, contentTokens, seededRandom(hashSeed(`${seed}:content`))),
    reasoningTokens,
    contentTokens,
    finishReason: wantedReasoning + knobs.completionTokens > budget ? 'length' : 'stop',
  };
}

// The failure regen exists to catch: an empty think block and a throwaway answer.
function degenerate(request: ChatRequest): Generated {
  return {
    reasoning: request.thinking ? '' : null,
    content: 'OK.',
    reasoningTokens: 0,
    contentTokens: 2,
    finishReason: 'stop',
  };
}

export interface Reply {
  body: object;
  completionTokens: number;
}

export interface ReplyPlan {
  degenerate: boolean;
  cachedTokens: number;
}

/** SGLang's non-streaming chat.completion body for `request`. */
export function buildReply(request: ChatRequest, knobs: Knobs, plan: ReplyPlan): Reply {
  const out = plan.degenerate ? degenerate(request) : generate(request, knobs);
  const completionTokens = out.reasoningTokens + out.contentTokens;
  return {
    completionTokens,
    body: {
      id: randomBytes(16).toString('hex'),
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: knobs.model,
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: out.content, reasoning_content: out.reasoning, tool_calls: null },
          logprobs: null,
          finish_reason: out.finishReason,
          matched_stop: out.finishReason === 'stop' ? EOS_TOKEN_ID : null,
        },
      ],
      usage: {
        prompt_tokens: request.promptTokens,
        completion_tokens: completionTokens,
        total_tokens: request.promptTokens + completionTokens,
        prompt_tokens_details: { cached_tokens: plan.cachedTokens },
        reasoning_tokens: out.reasoningTokens,
      },
    },
  };
}
