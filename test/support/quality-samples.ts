import { mulberry32 } from '../../src/domain/forecast.js';
import type { QualityInput } from '../../src/domain/quality.js';

// Answers as a model gives them, healthy and broken, from a seeded generator so every run of the
// quality tests sees the same samples.

/** Test samples drawn from a numbered seed (mulberry32, as the forecast's draws are). */
export const seeded = (seed: number): (() => number) => mulberry32(seed);

/** A standard normal draw (Box-Muller). */
export function gaussian(random: () => number): number {
  return Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
}

const pick = <T>(random: () => number, xs: readonly T[]): T => xs[Math.floor(random() * xs.length)];

const WORDS = (
  'the a of to and in that is for it as with was on be by this are from at or an which we have not but can its all one so if ' +
  'number value sum product equation function graph point line angle triangle circle area volume rate time distance speed ' +
  'price cost profit total average ratio fraction percent prime factor divisor remainder integer sequence term series limit ' +
  'first second third next then therefore thus hence because since given assume suppose consider note check verify compute ' +
  'city river country population history century war treaty king law court market energy water cell gene protein planet star'
).split(' ');

function sentence(random: () => number, words: number): string {
  const out: string[] = [];
  for (let i = 0; i < words; i++) out.push(random() < 0.12 ? String(Math.floor(random() * 10_000)) : pick(random, WORDS));
  const s = out.join(' ');
  return `${s[0].toUpperCase()}${s.slice(1)}.`;
}

function paragraph(random: () => number, sentences: number): string {
  return Array.from({ length: sentences }, () => sentence(random, 6 + Math.floor(random() * 18))).join(' ');
}

/** Completion lengths of reasoning answers: log-normal, median 1500 tokens, σ 0.6 (most between 500 and 5000). */
function reasoningTokens(random: () => number): number {
  return Math.max(1, Math.round(1500 * Math.exp(0.6 * gaussian(random))));
}

/** (a) A reasoning model thinking at length, with a parser: varied reasoning, a paragraph of answer. */
export function longReasoningAnswer(random: () => number): QualityInput {
  return {
    reasoning_content: paragraph(random, 8 + Math.floor(random() * 20)),
    content: paragraph(random, 1 + Math.floor(random() * 5)),
    finish_reason: 'stop',
    completion_tokens: reasoningTokens(random),
    thinking_requested: true,
  };
}

const CITIES = (
  'Paris London Tokyo Berlin Madrid Rome Lisbon Vienna Prague Warsaw Dublin Oslo Stockholm Helsinki Copenhagen Athens Cairo Nairobi ' +
  'Lagos Accra Dakar Tunis Rabat Ankara Tehran Baghdad Riyadh Doha Dubai Delhi Mumbai Dhaka Karachi Kabul Beijing Shanghai Seoul ' +
  'Manila Jakarta Hanoi Bangkok Sydney Auckland Ottawa Toronto Chicago Houston Lima Bogota Santiago Caracas Havana Quito'
).split(' ');

/** A number answer: half uniform up to 10,000, half log-uniform, so small numbers are commoner as in math sets. */
function numberAnswer(random: () => number): string {
  return String(random() < 0.5 ? Math.floor(random() * 10_000) : Math.floor(2 * 5000 ** random()));
}

/** (b) Short but distinct answers, no thinking: "42", a city, one sentence with its own numbers. Median about 10 tokens. */
export function shortAnswer(random: () => number): QualityInput {
  const kind = random();
  const content =
    kind < 0.35
      ? numberAnswer(random)
      : kind < 0.6
        ? pick(random, CITIES)
        : kind < 0.8
          ? `Yes, because ${sentence(random, 4 + Math.floor(random() * 8)).toLowerCase()}`
          : sentence(random, 5 + Math.floor(random() * 15));
  const tokens = Math.max(1, Math.round(content.length / 4) + Math.floor(random() * 3));
  return { reasoning_content: null, content, finish_reason: 'stop', completion_tokens: tokens, thinking_requested: false };
}

/** The 87% problem: an empty think block (null with a parser) and a throwaway "OK.", 2-4 tokens. */
export function okAnswer(random: () => number, thinking: boolean): QualityInput {
  return { reasoning_content: null, content: 'OK.', finish_reason: 'stop', completion_tokens: 2 + Math.floor(random() * 3), thinking_requested: thinking };
}

/** A server without --reasoning-parser: the think block stays inside content, reasoning_content is null. */
export function noParserAnswer(random: () => number): QualityInput {
  const a = longReasoningAnswer(random);
  return { ...a, content: `<think>\n${a.reasoning_content}\n</think>\n\n${a.content}`, reasoning_content: null };
}
