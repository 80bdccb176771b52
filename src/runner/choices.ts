import type { OtherChoice, Usage } from '../domain/output-line.js';
import { type Answer, type AnswerLimits, parseAnswers } from './request.js';

// A request for several answers to one line (params.n > 1): its samples, and how the one usage
// SGLang reports for all n choices is shared among their lines. Pure.

/** The samples of one request in choice order: choice i answers the i-th by sample_index. */
export function choiceOrder<T extends { sampleIndex: number }>(group: readonly T[]): T[] {
  return group.length === 1 ? [group[0]] : [...group].sort((a, b) => a.sampleIndex - b.sampleIndex);
}

/**
 * What one request for a line's answers is built from: the first of them, with the largest
 * max_tokens an on_length retry raised any of them to (a cut answer asked again beside a flagged
 * sibling keeps its room) and the most quality retries (a flagged one still gets a new seed).
 */
export function requestSample<T extends { maxTokens?: number | null; qualityRetries: number }>(group: readonly [T, ...T[]]): T {
  const [first] = group;
  // A request for one answer (the usual case) is built from that sample as it is.
  if (group.length === 1) return first;
  const raised = group.map((s) => s.maxTokens).filter((m): m is number => typeof m === 'number');
  return {
    ...first,
    maxTokens: raised.length ? Math.max(...raised) : (first.maxTokens ?? null),
    qualityRetries: Math.max(...group.map((s) => s.qualityRetries)),
  };
}

/** `total` cut into whole parts in proportion to `weights` (equal parts when all are 0), summing to it exactly (largest remainders). */
export function apportion(total: number, weights: readonly number[]): number[] {
  if (weights.length === 0) return [];
  const sum = weights.reduce((a, b) => a + b, 0);
  const shares = weights.map((w) => (sum > 0 ? (total * w) / sum : total / weights.length));
  const parts = shares.map(Math.floor);
  let left = total - parts.reduce((a, b) => a + b, 0);
  const byRemainder = shares.map((s, i) => [s - Math.floor(s), i] as const).sort((a, b) => b[0] - a[0] || a[1] - b[1]);
  for (const [, i] of byRemainder) {
    if (left <= 0) break;
    parts[i]++;
    left--;
  }
  return parts;
}

/**
 * Each choice's part of the request's usage. The prompt is the request's, prefilled once: its
 * prompt and cached tokens go to the first choice (sample_index 0 when the line's answers were
 * asked together), 0 on the others. SGLang sums the generated tokens over the choices without
 * saying each one's: completion and reasoning tokens are shared in proportion to each choice's
 * text (reasoning and content; reasoning alone for reasoning tokens), an estimate whose parts add
 * up to what the server reported. A choice that did not come back (null) takes no part.
 */
export function shareUsage(usage: Usage, answers: readonly (Pick<Answer, 'content' | 'reasoning'> | null)[]): Usage[] {
  if (answers.length === 1) return [usage];
  const textOf = (a: Pick<Answer, 'content' | 'reasoning'> | null) => (a ? (a.reasoning?.length ?? 0) + (a.content?.length ?? 0) : 0);
  // A choice with no text at all still took a token to end: it weighs as one character.
  const weights = answers.map((a) => (a ? Math.max(1, textOf(a)) : 0));
  const completion = apportion(usage.completion_tokens, weights);
  const reasoningWeights = answers.map((a) => a?.reasoning?.length ?? 0);
  const reasoning = reasoningWeights.some((w) => w > 0) ? apportion(usage.reasoning_tokens, reasoningWeights) : apportion(usage.reasoning_tokens, weights);
  // The one prefill goes on the first choice that came back: a choice missing from the answer is
  // failed without usage, and the run would lose the prompt's tokens with it.
  const first = Math.max(
    0,
    answers.findIndex((a) => a !== null),
  );
  return answers.map((_, i) => ({
    prompt_tokens: i === first ? usage.prompt_tokens : 0,
    cached_tokens: i === first ? usage.cached_tokens : 0,
    completion_tokens: completion[i],
    // A choice's reasoning is part of its completion: never more than it.
    reasoning_tokens: Math.min(reasoning[i], completion[i]),
  }));
}

/**
 * Choices 1…n−1 of an answer kept whole in one sample (an OpenAI batch line asking `n` in its
 * body: OpenAI's shape, not split or retried per choice), each as parseAnswers reads it; one sent
 * broken or not at all is kept as a choice with no text and no finish reason.
 */
export function otherChoices(res: unknown, limits: AnswerLimits): OtherChoice[] {
  return parseAnswers(res, limits, limits.choices)
    .slice(1)
    .map((p, i) =>
      p.ok
        ? {
            index: i + 1,
            content: p.answer.content,
            reasoning_content: p.answer.reasoning,
            finish_reason: p.answer.finishReason,
            ...(p.answer.logprobs && { logprobs: p.answer.logprobs }),
          }
        : { index: i + 1, content: null, reasoning_content: null, finish_reason: null },
    );
}

/** Each run's requests in flight, and the samples they answer: with params.n > 1 a request answers several. */
export function inFlightByRun(flights: Iterable<{ run: { id: string }; group: readonly unknown[] }>): Map<string, [requests: number, samples: number]> {
  const byRun = new Map<string, [requests: number, samples: number]>();
  for (const f of flights) {
    const [requests, samples] = byRun.get(f.run.id) ?? [0, 0];
    byRun.set(f.run.id, [requests + 1, samples + f.group.length]);
  }
  return byRun;
}
