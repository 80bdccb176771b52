import type { Usage } from '../domain/output-line.js';
import type { GenerationIds } from '../domain/token-rows.js';
import type { ChatResponse, ParsedAnswer } from './request.js';

// The server's own token ids (docs/sglang.md "Token ids"): which parameters ask for them, where
// they come back, and whether they can be trusted. Pure.

/**
 * How an endpoint returns ids, as its probe found (id-probe.ts): `sglext` (SGLang's
 * return_input_ids / return_output_ids, streamed too), `streamed_token_ids` (vLLM's
 * return_token_ids, whose stream carries the prompt's ids on its first event and each choice's
 * generated ids piece by piece), `token_ids` (SGLang's return_token_ids, refused on a stream, so
 * asked unstreamed), or `none` (a server that returns no ids).
 */
export type IdMode = 'sglext' | 'streamed_token_ids' | 'token_ids' | 'none';

/** What each mode sends; also the names a 400 about ids mentions. */
export const ID_PARAMS: Record<Exclude<IdMode, 'none'>, Record<string, true>> = {
  sglext: { return_input_ids_in_sglext: true, return_output_ids_in_sglext: true },
  streamed_token_ids: { return_token_ids: true },
  token_ids: { return_token_ids: true },
};

const ID_PARAM_PATTERN = /return_(input|output|prompt)?_?(token_)?ids/;

/** A 400 whose message names an id parameter: regen asked wrongly, the sample did nothing. */
export const namesIdParam = (status: number | null, message: string): boolean => status === 400 && ID_PARAM_PATTERN.test(message);

/** Whether ids come back on a stream: SGLang's sglext ones and vLLM's return_token_ids do, SGLang's return_token_ids is refused there. */
export const streamsIds = (mode: IdMode | null): boolean => mode === null || mode === 'sglext' || mode === 'streamed_token_ids';

/** The largest id a tokenizer may have when the server does not say its vocabulary. */
const MAX_ID = 2 ** 31 - 1;

interface IdsResponse extends ChatResponse {
  prompt_token_ids?: unknown;
  sglext?: { input_ids?: unknown; output_ids?: unknown } | null;
  choices?: (NonNullable<ChatResponse['choices']>[number] & { prompt_token_ids?: unknown; token_ids?: unknown })[];
}

const idList = (value: unknown): value is number[] => Array.isArray(value) && value.every((v) => Number.isInteger(v) && v >= 0 && v <= MAX_ID);

/** The prompt's ids and each choice's generated ids where `mode` puts them, or what is missing. */
export function pickIds(res: unknown, mode: Exclude<IdMode, 'none'>, count: number): { prompt: number[]; outputs: number[][] } | string {
  const r = (res ?? {}) as IdsResponse;
  const choices = r.choices ?? [];
  const choice = (i: number) => choices.find((c) => c?.index === i) ?? choices[i];
  const prompt = mode === 'sglext' ? r.sglext?.input_ids : (choice(0)?.prompt_token_ids ?? r.prompt_token_ids);
  const outputs = Array.from({ length: count }, (_, i) => (mode === 'sglext' ? (r.sglext?.output_ids as unknown[] | undefined)?.[i] : choice(i)?.token_ids));
  if (!idList(prompt)) return 'the endpoint answered without the prompt token ids asked for, or with ids outside the vocabulary';
  if (!outputs.every(idList)) return 'the endpoint answered without the generated token ids asked for, or with ids outside the vocabulary';
  return { prompt, outputs };
}

/** Each choice's ids in order, or why they cannot be trusted: missing, out of range, or counted unlike the usage. */
export function readIds(res: unknown, mode: Exclude<IdMode, 'none'>, count: number, usage: Usage): GenerationIds[] | string {
  const picked = pickIds(res, mode, count);
  if (typeof picked === 'string') return picked;
  const { prompt, outputs } = picked;
  if (prompt.length !== usage.prompt_tokens) return `the endpoint sent ${prompt.length} prompt token ids for usage.prompt_tokens ${usage.prompt_tokens}`;
  const generated = outputs.reduce((n, ids) => n + ids.length, 0);
  if (generated !== usage.completion_tokens) return `the endpoint sent ${generated} generated token ids for usage.completion_tokens ${usage.completion_tokens}`;
  return outputs.map((output) => ({ prompt, output }));
}

/**
 * The answers of a request that asked for ids, each with its choice's ids; every one malformed
 * when the ids cannot be trusted (asked again, never written).
 */
export function withIds(parsed: ParsedAnswer[], res: unknown, mode: Exclude<IdMode, 'none'>): ParsedAnswer[] {
  const first = parsed.find((p) => p.ok);
  if (!first?.ok) return parsed;
  const ids = readIds(res, mode, parsed.length, first.answer.usage);
  if (typeof ids === 'string') return parsed.map(() => ({ ok: false, error: { code: 'malformed_response', message: ids, status: null } }));
  return parsed.map((p, i) => (p.ok ? { ok: true, answer: { ...p.answer, ids: ids[i] } } : p));
}

/** With ids, each choice's completion tokens are its generated ids, no longer a share of the request's. */
export function exactUsage(usages: Usage[], answers: readonly ({ ids?: GenerationIds } | null)[]): Usage[] {
  return usages.map((u, i) => {
    const ids = answers[i]?.ids;
    return ids ? { ...u, completion_tokens: ids.output.length, reasoning_tokens: Math.min(u.reasoning_tokens, ids.output.length) } : u;
  });
}
