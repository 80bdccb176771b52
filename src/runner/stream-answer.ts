import { wellFormedText } from '../domain/text.js';
import { type Answer, type ChatResponse, LOOP_FINISH_REASON, readAnswerJson } from './request.js';

// A streamed chat completion put back together: the same record parseAnswer reads from a
// buffered one. Pure, so that every chunk shape has a case in a table test.

/** One `chat.completion.chunk` as SGLang streams it (serving_chat.py); anything may be missing from a broken server. */
interface Chunk {
  id?: string;
  created?: number;
  model?: string;
  choices?: { delta?: { content?: unknown; reasoning_content?: unknown; tool_calls?: unknown }; finish_reason?: string | null; token_ids?: unknown }[];
  usage?: ChatResponse['usage'] | null;
  /** SGLang's token ids (return_input_ids / return_output_ids), in a last event with no choices. */
  sglext?: unknown;
  /** vLLM's return_token_ids: the prompt's ids on the first event; each choice's generated ids come in pieces on its events. */
  prompt_token_ids?: unknown;
  error?: { message?: unknown; code?: unknown };
}

/** An `{"error": …}` event: SGLang's way to fail a stream after its 200 went out. */
export interface StreamError {
  status: number;
  error: { message: string };
}

const MID_STREAM_ERROR_STATUS = 500;

/** One call's fragments of `delta.tool_calls`, by their `index`: the id and name come once, the arguments in pieces. */
interface CallPieces {
  id: string | undefined;
  name: string;
  args: string[];
}

export class StreamedAnswer {
  private readonly content: string[] = [];
  private readonly reasoning: string[] = [];
  private readonly calls = new Map<number, CallPieces>();
  private id: string | undefined;
  private created: number | undefined;
  private model: string | undefined;
  private finishReason: string | null = null;
  private hadChoice = false;
  private usage: ChatResponse['usage'];
  private sglext: unknown;
  private promptIds: unknown;
  /** vLLM's generated ids, each event's piece in order; null until one came (a piece that is no list of numbers is kept, for readIds to refuse). */
  private tokenIds: unknown[] | null = null;
  /** Events that carried text: SGLang sends one a token (its default stream_interval of 1). */
  textEvents = 0;

  /**
   * Takes one event's data. Returns the text it added (for the loop watch), or a StreamError for
   * an error event. Throws AnswerRefused on data that is not JSON, or nested too deep: the stream
   * is then broken.
   */
  add(data: string): { content: string; reasoning: string } | StreamError {
    const chunk = readAnswerJson(data, 'the endpoint streamed an event that is not JSON') as Chunk;
    if (chunk.error) {
      const { message, code } = chunk.error;
      const status = typeof code === 'number' && code >= 400 && code < 600 ? code : MID_STREAM_ERROR_STATUS;
      return { status, error: { message: typeof message === 'string' ? message : 'the stream failed' } };
    }
    this.id ??= chunk.id;
    this.created ??= chunk.created;
    this.model ??= chunk.model;
    if (chunk.usage) this.usage = chunk.usage;
    if (chunk.sglext) this.sglext = chunk.sglext;
    if (chunk.prompt_token_ids != null) this.promptIds = chunk.prompt_token_ids;
    const choice = chunk.choices?.[0];
    if (!choice) return NO_TEXT;
    this.hadChoice = true;
    if (choice.token_ids != null) {
      this.tokenIds ??= [];
      if (Array.isArray(choice.token_ids)) for (const id of choice.token_ids) this.tokenIds.push(id);
      else this.tokenIds.push(choice.token_ids);
    }
    if (choice.finish_reason) this.finishReason = choice.finish_reason;
    const content = typeof choice.delta?.content === 'string' ? choice.delta.content : '';
    const reasoning = typeof choice.delta?.reasoning_content === 'string' ? choice.delta.reasoning_content : '';
    if (content) this.content.push(content);
    if (reasoning) this.reasoning.push(reasoning);
    if (content || reasoning) this.textEvents++;
    // Calls are not watched for loops: their arguments are data the template's schema bounds.
    if (Array.isArray(choice.delta?.tool_calls)) for (const piece of choice.delta.tool_calls) this.addCall(piece);
    return { content, reasoning };
  }

  /** One fragment of a call as SGLang streams it (serving_chat.py): `index`, then `id` and `function.name` once, `function.arguments` in pieces. */
  private addCall(piece: unknown): void {
    const p = (piece ?? {}) as { index?: unknown; id?: unknown; function?: { name?: unknown; arguments?: unknown } };
    const index = typeof p.index === 'number' ? p.index : this.calls.size;
    let call = this.calls.get(index);
    if (!call) this.calls.set(index, (call = { id: undefined, name: '', args: [] }));
    if (typeof p.id === 'string' && p.id !== '') call.id = p.id;
    if (typeof p.function?.name === 'string' && p.function.name !== '') call.name = p.function.name;
    if (typeof p.function?.arguments === 'string') call.args.push(p.function.arguments);
  }

  /** The buffered answer this stream stands for: content "" when empty, reasoning_content null when empty, as SGLang sends them. */
  response(): ChatResponse & { sglext?: unknown; prompt_token_ids?: unknown } {
    return {
      ...(this.sglext !== undefined && { sglext: this.sglext }),
      ...(this.promptIds !== undefined && { prompt_token_ids: this.promptIds }),
      id: this.id,
      created: this.created,
      model: this.model,
      choices: this.hadChoice
        ? [
            {
              message: {
                content: this.content.join(''),
                reasoning_content: this.reasoning.length ? this.reasoning.join('') : null,
                ...(this.calls.size && {
                  tool_calls: [...this.calls.entries()]
                    .sort(([a], [b]) => a - b)
                    .map(([, c]) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.args.join('') } })),
                }),
              },
              finish_reason: this.finishReason,
              ...(this.tokenIds && { token_ids: this.tokenIds }),
            },
          ]
        : [],
      usage: this.usage,
    };
  }

  /**
   * The answer a stream cut because it looped stood at: its text as parseAnswer keeps any answer's,
   * without unpaired surrogates (`repaired` when some were replaced), one token an event streamed.
   */
  loopAnswer(): { answer: Answer; repaired: boolean } {
    const res = this.response();
    const message = res.choices?.[0]?.message;
    const rawContent = typeof message?.content === 'string' ? message.content : '';
    const rawReasoning = typeof message?.reasoning_content === 'string' ? message.reasoning_content : null;
    const content = wellFormedText(rawContent);
    const reasoning = rawReasoning === null ? null : wellFormedText(rawReasoning);
    const answer: Answer = {
      content,
      reasoning,
      toolCalls: null,
      finishReason: LOOP_FINISH_REASON,
      usage: { prompt_tokens: 0, completion_tokens: this.textEvents, reasoning_tokens: 0, cached_tokens: 0 },
      model: res.model ?? null,
      responseId: res.id,
      created: res.created,
      logprobs: null,
    };
    return { answer, repaired: content !== rawContent || reasoning !== rawReasoning };
  }
}

const NO_TEXT = { content: '', reasoning: '' };
