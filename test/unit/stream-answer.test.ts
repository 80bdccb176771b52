import { describe, expect, it } from 'vitest';
import { isRepetitive, LoopWatch } from '../../src/domain/quality.js';
import { parseAnswer } from '../../src/runner/request.js';
import { StreamedAnswer } from '../../src/runner/stream-answer.js';

const chunk = (delta: object | null, extra: object = {}) =>
  JSON.stringify({
    id: 'r1',
    object: 'chat.completion.chunk',
    created: 5,
    model: 'm',
    choices: delta ? [{ index: 0, delta, finish_reason: null }] : [],
    ...extra,
  });

describe('StreamedAnswer', () => {
  it('puts a stream back into the record a buffered answer gives', () => {
    const s = new StreamedAnswer();
    s.add(chunk({ role: 'assistant', content: '' }));
    s.add(chunk({ content: null, reasoning_content: 'think ' }));
    s.add(chunk({ reasoning_content: 'more' }));
    s.add(chunk({ content: 'The answer.' }));
    s.add(JSON.stringify({ id: 'r1', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }));
    s.add(chunk(null, { usage: { prompt_tokens: 7, completion_tokens: 3, reasoning_tokens: 2, prompt_tokens_details: null } }));
    expect(s.textEvents).toBe(3);
    const parsed = parseAnswer(s.response());
    expect(parsed).toEqual({
      ok: true,
      answer: {
        content: 'The answer.',
        reasoning: 'think more',
        toolCalls: null,
        finishReason: 'stop',
        usage: { prompt_tokens: 7, completion_tokens: 3, reasoning_tokens: 2, cached_tokens: 0 },
        model: 'm',
        responseId: 'r1',
        created: 5,
        logprobs: null,
      },
    });
  });

  it('gives content "" and reasoning null when none came, and no choice for a stream without any', () => {
    const s = new StreamedAnswer();
    s.add(chunk({ role: 'assistant', content: '' }));
    s.add(JSON.stringify({ choices: [{ delta: {}, finish_reason: 'length' }] }));
    expect(s.response().choices).toEqual([{ message: { content: '', reasoning_content: null }, finish_reason: 'length' }]);
    const empty = new StreamedAnswer();
    empty.add(chunk(null, { usage: { prompt_tokens: 1 } }));
    expect(parseAnswer(empty.response()).ok).toBe(false);
  });

  it("reads SGLang's error event with its code, and a 500 without one", () => {
    const s = new StreamedAnswer();
    expect(s.add(JSON.stringify({ error: { object: 'error', message: 'too long', code: 400 } }))).toEqual({ status: 400, error: { message: 'too long' } });
    expect(s.add(JSON.stringify({ error: { message: 'boom' } }))).toEqual({ status: 500, error: { message: 'boom' } });
    expect(() => s.add('not json')).toThrow();
  });
});

describe('LoopWatch', () => {
  const feed = (text: string, piece = 4): number | null => {
    const w = new LoopWatch();
    for (let i = 0; i < text.length; i += piece) if (w.add(text.slice(i, i + piece))) return i + piece;
    return null;
  };

  it('catches a loop within a bounded stretch of it, whatever came before', () => {
    const healthy = Array.from({ length: 2000 }, (_, i) => `word${(i * 7919) % 1009}`).join(' ');
    const loop = 'wait, let me check that again. '.repeat(1000);
    const at = feed(healthy + loop);
    expect(at).not.toBeNull();
    expect(at! - healthy.length).toBeLessThan(1000);
    expect(isRepetitive(healthy + loop)).toBe(true);
  });

  it('never cuts healthy text, and not a short periodic stretch the text leaves again', () => {
    const healthy = Array.from({ length: 5000 }, (_, i) => `word${(i * 7919) % 1009}`).join(' ');
    expect(feed(healthy)).toBeNull();
    // A 400-character rule of dashes in the middle: periodic at one check, gone at the next.
    expect(feed(`${healthy.slice(0, 3000)}${'-'.repeat(400)}${healthy.slice(3000)}`, 256)).toBeNull();
  });
});
