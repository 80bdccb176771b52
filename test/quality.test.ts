import { describe, expect, it } from 'vitest';
import { FLAGS, bitsFromFlags, flagBit, flagsFromBits } from '../src/domain/flags.js';
import { thinkingRequested } from '../src/domain/run-settings.js';
import { computeFlags, isRepetitive, type QualityInput, WHITESPACE_TO_COLLAPSE } from '../src/domain/quality.js';

const healthy: QualityInput = {
  content: 'The answer is 42, because 6 × 7 = 42.',
  reasoning_content: 'We need 6 times 7. 6 × 7 = 42. So the answer is 42.',
  finish_reason: 'stop',
  completion_tokens: 120,
  thinking_requested: true,
};
const cfg = { min_completion_tokens: 10 };

describe('flag bits', () => {
  it('gives each flag its own bit in FLAGS order', () => {
    expect(FLAGS.map(flagBit)).toEqual([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]);
  });

  it('round-trips between flags and bits', () => {
    expect(bitsFromFlags([])).toBe(0);
    expect(bitsFromFlags(['truncated', 'empty_content'])).toBe(5);
    expect(bitsFromFlags(['too_short', 'too_short'])).toBe(16);
    expect(flagsFromBits(0)).toEqual([]);
    expect(flagsFromBits(5)).toEqual(['empty_content', 'truncated']);
    expect(flagsFromBits(8191)).toEqual([...FLAGS]);
    for (let bits = 0; bits < 8192; bits++) expect(bitsFromFlags(flagsFromBits(bits))).toBe(bits);
  });

  it('ignores bits no flag owns', () => {
    expect(flagsFromBits(8192 | 8)).toEqual(['repetitive']);
  });
});

describe('computeFlags', () => {
  const flagsOf = (over: Partial<QualityInput>, c = cfg) => flagsFromBits(computeFlags({ ...healthy, ...over }, c));

  it('flags nothing on a healthy sample', () => {
    expect(computeFlags(healthy, cfg)).toBe(0);
  });

  it('flags empty content: null, empty or blank', () => {
    expect(flagsOf({ content: null })).toEqual(['empty_content']);
    expect(flagsOf({ content: '' })).toEqual(['empty_content']);
    expect(flagsOf({ content: ' \n\t\n ' })).toEqual(['empty_content']);
  });

  it('flags missing reasoning only when thinking was requested', () => {
    expect(flagsOf({ reasoning_content: null })).toEqual(['missing_reasoning']);
    expect(flagsOf({ reasoning_content: '\n\n' })).toEqual(['missing_reasoning']);
    expect(flagsOf({ reasoning_content: null, thinking_requested: false })).toEqual([]);
  });

  it('flags the 87% problem: empty think block and a one-word answer', () => {
    const bits = computeFlags(
      { content: 'OK.', reasoning_content: '', finish_reason: 'stop', completion_tokens: 3, thinking_requested: true },
      { min_completion_tokens: 16 },
    );
    expect(flagsFromBits(bits)).toEqual(['missing_reasoning', 'too_short']);
  });

  it('flags truncation only for finish_reason length', () => {
    expect(flagsOf({ finish_reason: 'length' })).toEqual(['truncated']);
    expect(flagsOf({ finish_reason: null })).toEqual([]);
    expect(flagsOf({ finish_reason: 'tool_calls' })).toEqual([]);
  });

  it('flags too_short below the minimum, and never when the minimum is 0', () => {
    expect(flagsOf({ completion_tokens: 9 })).toEqual(['too_short']);
    expect(flagsOf({ completion_tokens: 10 })).toEqual([]);
    expect(flagsOf({ completion_tokens: 0 }, { min_completion_tokens: 0 })).toEqual([]);
  });

  it('flags a think block left inside content by a server without a reasoning parser', () => {
    const whole = '<think>\nLet me add 2 and 2.\n</think>\n\nThe answer is 4.';
    expect(flagsOf({ content: whole, reasoning_content: null, thinking_requested: false })).toEqual(['think_in_content']);
    expect(flagsOf({ content: whole, reasoning_content: null })).toEqual(['missing_reasoning', 'think_in_content']);
    // Cut open by max_tokens, or with <think> already in the prompt (Qwen3's template).
    expect(flagsOf({ content: '<think>\nLet me add', finish_reason: 'length' })).toEqual(['truncated', 'think_in_content']);
    expect(flagsOf({ content: 'Adding 2 and 2.\n</think>\n\n4' })).toEqual(['think_in_content']);
    expect(flagsOf({ content: 'I will think about it.' })).toEqual([]);
  });

  it('collapses whitespace as /\\s+/ would', () => {
    for (const text of ['a b', 'a  b', 'a\tb', 'a \n\t b', ' \n', 'a\u00a0b c\r\nd', '  x  ', 'a\u2028 b'])
      expect(text.replace(WHITESPACE_TO_COLLAPSE, ' ')).toBe(text.replace(/\s+/g, ' '));
  });

  it('flags a loop in the content or in the reasoning', () => {
    const loop = 'I think the answer is 5. '.repeat(40);
    expect(flagsOf({ content: loop })).toEqual(['repetitive']);
    expect(flagsOf({ reasoning_content: loop })).toEqual(['repetitive']);
    expect(flagsOf({ content: null, reasoning_content: loop })).toEqual(['empty_content', 'repetitive']);
  });

  it('combines flags of a runaway generation', () => {
    const bits = computeFlags(
      {
        content: null,
        reasoning_content: 'Let me check. ' + 'wait, '.repeat(2000),
        finish_reason: 'length',
        completion_tokens: 4096,
        thinking_requested: true,
      },
      cfg,
    );
    expect(flagsFromBits(bits)).toEqual(['empty_content', 'truncated', 'repetitive']);
  });
});

describe('isRepetitive on loops', () => {
  it('flags a repeated sentence', () => {
    expect(isRepetitive('I think the answer is 5. '.repeat(30))).toBe(true);
  });

  it('flags "wait, wait, wait, ..."', () => {
    expect(isRepetitive('wait, '.repeat(200))).toBe(true);
  });

  it('flags a single token repeated', () => {
    expect(isRepetitive('the '.repeat(100))).toBe(true);
    expect(isRepetitive('a'.repeat(1000))).toBe(true);
  });

  it('flags a 150-character paragraph repeated 6 times', () => {
    const paragraph =
      'Let me reconsider the problem from the start. The train leaves at 3 pm and travels at 60 km/hr, so after two hours it has covered 120 km of the route.';
    expect(paragraph).toHaveLength(150);
    expect(isRepetitive(`${paragraph}\n\n`.repeat(6))).toBe(true);
  });

  it('flags a loop that starts after a healthy prefix', () => {
    const prefix = healthyReasoning.slice(0, 1500);
    expect(isRepetitive(`${prefix}\n\nSo the total is 12. `.concat('Hmm, so the total is 12. '.repeat(40)))).toBe(true);
  });

  it('flags a loop cut off in the middle of a repeat, as a token limit does', () => {
    expect(isRepetitive('We get x = 3. Then we check x = 3. '.repeat(20) + 'We get x')).toBe(true);
  });

  it('treats whitespace differences between repeats as the same span', () => {
    const variants = ['Check again.\n', 'Check again. ', 'Check again.\n\n', 'Check again.\t'];
    const text = Array.from({ length: 60 }, (_, i) => variants[i % variants.length]).join('');
    expect(isRepetitive(text)).toBe(true);
  });

  it('flags a short text that is nothing but a loop', () => {
    expect(isRepetitive('wait, wait, wait, wait, wait, wait,')).toBe(true);
  });

  it('looks only at the tail of a very long loop', () => {
    expect(isRepetitive('Answer: '.repeat(200_000))).toBe(true);
  });

  it('flags a loop with a 200-character period', () => {
    const span = 'x'.repeat(150) + ' this block of two hundred characters repeats, ' + 'y'.repeat(3);
    expect(span).toHaveLength(200);
    expect(isRepetitive(span.repeat(6))).toBe(true);
  });

  it('flags a whole paragraph repeated, as reasoning models loop (350 and 500 characters)', () => {
    const paragraph =
      'Let me reconsider the problem from the start, because something seems off with the approach I took. ' +
      'The train leaves at 3 pm and travels at 60 km/hr, so after two hours it has covered 120 km of the route. ' +
      'The second train leaves an hour later at 80 km/hr, so it catches up when 80(t-1) = 60t, that is t = 4. ';
    expect(paragraph.length).toBeGreaterThan(300);
    expect(isRepetitive(healthyReasoning.slice(0, 800) + paragraph.repeat(5))).toBe(true);
    const longest = paragraph + 'z'.repeat(500 - paragraph.length);
    expect(isRepetitive(longest.repeat(4))).toBe(true);
    // Three repeats of a 600-character span are not enough evidence in a 2000-character window.
    expect(isRepetitive((paragraph + 'q'.repeat(600 - paragraph.length)).repeat(3))).toBe(false);
  });

  it('flags a loop in text without spaces (Chinese) and a repeated final answer', () => {
    expect(isRepetitive('首先，我们需要计算总数。' + '所以答案是5。'.repeat(80))).toBe(true);
    expect(isRepetitive('The final answer is \\boxed{42}.\n'.repeat(30))).toBe(true);
  });
});

describe('isRepetitive on healthy text', () => {
  it('passes a multi-paragraph reasoning trace', () => {
    expect(isRepetitive(healthyReasoning)).toBe(false);
  });

  it('passes a markdown list with a repeated bullet structure', () => {
    const steps = Array.from({ length: 40 }, (_, i) => `- Step ${i + 1}: add the next term to the running total and check the result.`).join('\n');
    expect(isRepetitive(`Here is the plan:\n\n${steps}\n\nThat completes the plan.`)).toBe(false);
    expect(isRepetitive(steps)).toBe(false);
  });

  it('passes code with repeated similar lines', () => {
    const code = ['function init(grid: number[][]): void {', ...Array.from({ length: 60 }, (_, i) => `  grid[${i}][0] = 0;`), '}'].join('\n');
    expect(isRepetitive(code)).toBe(false);
    expect(isRepetitive(`\`\`\`ts\n${code}\n\`\`\``)).toBe(false);
  });

  it('passes Chinese prose and a list counting up', () => {
    expect(
      isRepetitive('首先，我们需要计算总数。然后我们检查每一步是否正确，最后得出结论：答案是五。这个方法适用于所有类似的问题，因为它遵循了基本的计数原理。'),
    ).toBe(false);
    expect(isRepetitive(Array.from({ length: 400 }, (_, i) => i + 1).join(', '))).toBe(false);
  });

  it('passes a markdown table', () => {
    const rows = Array.from({ length: 50 }, (_, i) => `| ${i} | item ${i} | ${(i * 1.5).toFixed(1)} | ok |`);
    const table = ['| # | name | price | status |', '|---|---|---|---|', ...rows].join('\n');
    expect(isRepetitive(table)).toBe(false);
  });

  it('passes short legitimate runs: a rule, an ellipsis, a few repeats', () => {
    expect(isRepetitive(`${healthyReasoning}\n\n${'-'.repeat(80)}`)).toBe(false);
    expect(isRepetitive('The list goes on...')).toBe(false);
    expect(isRepetitive('ha ha ha ha')).toBe(false);
    expect(isRepetitive('0000')).toBe(false);
    expect(isRepetitive(`${healthyReasoning} ${'Yes. '.repeat(10)}`)).toBe(false);
  });

  it('treats empty and whitespace-only text as not repetitive (it is empty)', () => {
    expect(isRepetitive('')).toBe(false);
    expect(isRepetitive('\n\n\n\n')).toBe(false);
    expect(isRepetitive(' '.repeat(10_000))).toBe(false);
  });

  it('passes a loop that the answer later moves on from', () => {
    const text = 'wait, '.repeat(100) + '\n\n' + healthyReasoning;
    expect(isRepetitive(text)).toBe(false);
  });
});

describe('isRepetitive cost', () => {
  // Speed is a benchmark's business; what a test can pin is that the cost is bounded: the detector
  // reads only a fixed-size tail, so a 1 MB input answers exactly as its last few KB do.
  it('reads only a bounded tail of a 1 MB input, healthy or looping', () => {
    const inputs = [
      healthyReasoning.repeat(Math.ceil(1_000_000 / healthyReasoning.length)),
      'wait, '.repeat(170_000),
      'a'.repeat(250) + 'b'.repeat(1_000_000),
      // Periodic with every period, but too short to flag: the worst case for the scan.
      healthyReasoning + 'c'.repeat(299),
    ];
    const answers = inputs.map((input) => isRepetitive(input));
    expect(answers).toEqual(inputs.map((input) => isRepetitive(input.slice(-4000))));
    expect(answers).toEqual([false, true, true, false]);
  });
});

describe('thinkingRequested', () => {
  it('reads chat_template_kwargs.enable_thinking or .thinking', () => {
    expect(thinkingRequested({ chat_template_kwargs: { enable_thinking: true } }, 'm')).toBe(true);
    expect(thinkingRequested({ chat_template_kwargs: { thinking: true } }, 'm')).toBe(true);
    expect(thinkingRequested({ temperature: 0.6, chat_template_kwargs: { enable_thinking: true, foo: 1 } }, 'm')).toBe(true);
  });

  it('is false for other models unless asked for', () => {
    expect(thinkingRequested({}, 'm')).toBe(false);
    expect(thinkingRequested({ chat_template_kwargs: { enable_thinking: false } }, 'm')).toBe(false);
    expect(thinkingRequested({ chat_template_kwargs: { enable_thinking: 'true' } }, 'm')).toBe(false);
    expect(thinkingRequested({ chat_template_kwargs: null }, 'm')).toBe(false);
    expect(thinkingRequested({ chat_template_kwargs: 'enable_thinking' }, 'm')).toBe(false);
    expect(thinkingRequested({ enable_thinking: true }, 'm')).toBe(false);
  });

  it('follows Qwen3: thinking by default, off only when enable_thinking is false', () => {
    expect(thinkingRequested({}, 'Qwen/Qwen3-27B')).toBe(true);
    expect(thinkingRequested({}, '/models/qwen3-8b')).toBe(true);
    expect(thinkingRequested({ chat_template_kwargs: { enable_thinking: false } }, 'Qwen/Qwen3-27B')).toBe(false);
  });

  it('turns thinking on with reasoning_effort or reasoning', () => {
    expect(thinkingRequested({ reasoning_effort: 'high' }, 'm')).toBe(true);
    expect(thinkingRequested({ reasoning: { effort: 'low' } }, 'm')).toBe(true);
    expect(thinkingRequested({ reasoning_effort: 'high', chat_template_kwargs: { enable_thinking: false } }, 'm')).toBe(false);
  });
});

const healthyReasoning = `Okay, let me work through this carefully. The question asks how many ways there are to arrange the letters of the word "BANANA" so that no two A's are adjacent.

First, count the letters: B appears once, A appears three times, and N appears twice. The total number of distinct arrangements without any restriction is 6! / (3! · 2!) = 720 / 12 = 60.

Now for the restriction. A standard approach is to place the non-A letters first and then insert the A's into the gaps. The non-A letters are B, N, N. They can be arranged in 3! / 2! = 3 ways: BNN, NBN, NNB.

Each arrangement of three letters creates four gaps: before the first letter, between the first and second, between the second and third, and after the third. To keep the A's apart, each A must go into a different gap. Choosing 3 of the 4 gaps gives C(4, 3) = 4 ways.

So the count is 3 × 4 = 12. Let me double-check by listing for one arrangement, say BNN: the gaps are _B_N_N_, and picking three gaps gives ABANAN, ABANNA, ABNANA, BANANA. That is four, which matches.

Wait, I should also make sure I have not double-counted. The arrangements of B, N, N are distinct as strings, and each choice of gaps yields a distinct final word, so there is no overlap between the cases.

Therefore the answer is 12 arrangements out of 60, which is a probability of 1/5 if an arrangement is chosen uniformly at random.`;
