import { createHash } from 'node:crypto';

/** The simulator's tokenizer: one token per four characters, close enough to BPE on English text. */
export const CHARS_PER_TOKEN = 4;

// Chat templates wrap every message in role markers and separators.
const TOKENS_PER_MESSAGE = 4;

// Varied enough that generated text never looks like one short span repeated (a degenerate loop).
const WORDS = [
  'the',
  'question',
  'asks',
  'about',
  'a',
  'careful',
  'answer',
  'which',
  'should',
  'consider',
  'each',
  'step',
  'first',
  'then',
  'we',
  'check',
  'whether',
  'this',
  'value',
  'holds',
  'because',
  'it',
  'follows',
  'from',
  'previous',
  'result',
  'so',
  'next',
  'compute',
  'total',
  'and',
  'compare',
  'with',
  'expected',
  'case',
  'otherwise',
  'revise',
  'assumption',
  'given',
  'data',
  'therefore',
  'final',
  'reason',
  'clearly',
  'simple',
  'example',
  'shows',
  'pattern',
  'might',
  'work',
];

export type Random = () => number;

/** mulberry32: a tiny, fast PRNG; the same seed always yields the same sequence. */
export function seededRandom(seed: number): Random {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** 32-bit FNV-1a, to turn a string into a PRNG seed. */
export function hashSeed(text: string): number {
  return hashRange(text, 0, text.length);
}

/** hashSeed of `text.slice(start, end)`, without making the slice. */
function hashRange(text: string, start: number, end: number): number {
  let hash = 0x811c9dc5;
  for (let i = start; i < end; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193);
  }
  return hash >>> 0;
}

/** First 16 hex characters of the sha256 of the messages: what the reply is derived from. */
export function digestOf(messages: unknown[]): string {
  return createHash('sha256').update(JSON.stringify(messages)).digest('hex').slice(0, 16);
}

export function countPromptTokens(messages: Record<string, unknown>[]): number {
  let chars = 0;
  for (const message of messages) chars += contentChars(message.content) + callsText(message.tool_calls).length;
  return Math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * messages.length;
}

// Content is a string or an array of parts; only text parts count (images and such are out of scope).
function contentChars(content: unknown): number {
  if (typeof content === 'string') return content.length;
  if (!Array.isArray(content)) return 0;
  let chars = 0;
  for (const part of content) {
    if (typeof part?.text === 'string') chars += part.text.length;
  }
  return chars;
}

/**
 * `prefix` followed by random words, cut to exactly `tokens` tokens' worth of characters, so a
 * shorter text from the same seed is always a prefix of a longer one (as truncation would give).
 */
export function fillerText(prefix: string, tokens: number, random: Random): string {
  const length = tokens * CHARS_PER_TOKEN;
  let text = prefix;
  while (text.length < length) {
    text += WORDS[Math.floor(random() * WORDS.length)];
    text += random() < 0.1 ? '. ' : ' ';
  }
  return text.slice(0, length);
}

// The chat template's markers as the prefix cache sees them: <|im_start|>, <|im_end|>, <think>, </think>.
const IM_START = hashSeed('<|im_start|>');
const IM_END = hashSeed('<|im_end|>');
const NEWLINE = hashSeed('\n');
const THINK = hashSeed('<think>');
const THINK_END = hashSeed('</think>');

/** Text as the prefix cache's tokens, appended to `tokens`: one a CHARS_PER_TOKEN characters, the same text always the same tokens. */
export function textTokens(text: string, tokens: number[] = []): number[] {
  for (let i = 0; i < text.length; i += CHARS_PER_TOKEN) tokens.push(hashRange(text, i, Math.min(i + CHARS_PER_TOKEN, text.length)));
  return tokens;
}

function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content.map((part) => (typeof part?.text === 'string' ? part.text : '')).join('');
}

/**
 * Tool calls as Qwen's template renders them after an assistant message's content: one
 * `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` a call. Without a tool-call parser this
 * is also the text the model's answer holds.
 */
export function callsText(calls: unknown): string {
  if (!Array.isArray(calls)) return '';
  return calls
    .map((c) => {
      const f = (c as { function?: { name?: unknown; arguments?: unknown } } | null)?.function ?? {};
      return `<tool_call>\n{"name": ${JSON.stringify(f.name ?? '')}, "arguments": ${typeof f.arguments === 'string' ? f.arguments : JSON.stringify(f.arguments ?? {})}}\n</tool_call>`;
    })
    .join('\n');
}

/**
 * The chat-templated prompt as tokens, ChatML as Qwen's template writes it: each message
 * `<|im_start|>role\n content <|im_end|>`, then the generation prompt `<|im_start|>assistant\n`.
 * An earlier assistant turn is its content only (Qwen3's template drops earlier thinking), but
 * one after the last user message (a tool loop's step) keeps its `reasoning_content` as a think
 * block, as Qwen3's template renders it; a step's calls follow its content.
 */
export function promptSequence(messages: Record<string, unknown>[]): number[] {
  const tokens: number[] = [];
  let lastUser = -1;
  for (const [i, message] of messages.entries()) if (message.role === 'user') lastUser = i;
  for (const [i, message] of messages.entries()) {
    tokens.push(IM_START, hashSeed(String(message.role)), NEWLINE);
    if (message.role === 'assistant' && i > lastUser && typeof message.reasoning_content === 'string') {
      tokens.push(THINK);
      textTokens(message.reasoning_content, tokens);
      tokens.push(THINK_END);
    }
    textTokens(contentText(message.content) + callsText(message.tool_calls), tokens);
    tokens.push(IM_END);
  }
  tokens.push(IM_START, hashSeed('assistant'), NEWLINE);
  return tokens;
}

/** What the model generated, as tokens: a think block first when it thought, then the answer and <|im_end|>. */
export function answerSequence(reasoning: string | null, content: string): number[] {
  const tokens: number[] = [];
  if (reasoning !== null) {
    tokens.push(THINK);
    textTokens(reasoning, tokens);
    tokens.push(THINK_END);
  }
  textTokens(content, tokens);
  tokens.push(IM_END);
  return tokens;
}
