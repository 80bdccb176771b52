import { describe, expect, it } from 'vitest';
import { PrefixCache } from '../../src/sim/prefix-cache.js';
import { answerSequence, promptSequence } from '../../src/sim/text.js';

const seq = (...tokens: number[]): number[] => tokens;

describe('the simulator prefix cache', () => {
  it('matches the longest cached prefix, splitting edges where prompts part', () => {
    const cache = new PrefixCache(() => 1000);
    expect(cache.match(seq(1, 2, 3)).length).toBe(0);
    cache.insert(seq(1, 2, 3, 4, 5));
    expect(cache.match(seq(1, 2, 3, 4, 5, 6)).length).toBe(5);
    expect(cache.match(seq(1, 2, 9)).length).toBe(2);
    cache.insert(seq(1, 2, 9, 9));
    expect(cache.size).toBe(7);
    expect(cache.match(seq(1, 2, 9, 9, 9)).length).toBe(4);
    expect(cache.match(seq(1, 2, 3, 4, 5)).length).toBe(5);
    expect(cache.match(seq(7)).length).toBe(0);
  });

  it('evicts the least recently used unlocked leaves when the pool is small', () => {
    const cache = new PrefixCache(() => 10);
    cache.insert(seq(1, 1, 1, 1));
    cache.insert(seq(2, 2, 2, 2));
    // 1… is touched, so 2… is the oldest when the third prompt needs room.
    cache.match(seq(1, 1, 1, 1));
    cache.insert(seq(3, 3, 3, 3));
    expect(cache.size).toBeLessThanOrEqual(10);
    expect(cache.match(seq(1, 1, 1, 1)).length).toBe(4);
    expect(cache.match(seq(2, 2, 2, 2)).length).toBe(0);
    expect(cache.match(seq(3, 3, 3, 3)).length).toBe(4);
  });

  it('keeps a locked path (a running request) however old, and frees it once unlocked', () => {
    const cache = new PrefixCache(() => 8);
    const running = cache.insert(seq(1, 1, 1, 1));
    cache.lock(running);
    cache.insert(seq(2, 2, 2, 2));
    cache.insert(seq(3, 3, 3, 3));
    expect(cache.match(seq(1, 1, 1, 1)).length).toBe(4);
    expect(cache.match(seq(2, 2, 2, 2)).length).toBe(0);
    cache.unlock(running);
    cache.insert(seq(4, 4, 4, 4));
    cache.insert(seq(5, 5, 5, 5));
    expect(cache.match(seq(1, 1, 1, 1)).length).toBe(0);
    expect(cache.size).toBeLessThanOrEqual(8);
  });

  it('a lock taken on a node survives the split of its edge', () => {
    const cache = new PrefixCache(() => 6);
    const node = cache.insert(seq(1, 2, 3, 4));
    cache.lock(node);
    cache.insert(seq(1, 2, 8));
    cache.unlock(node);
    cache.insert(seq(5, 5, 5, 5, 5, 5));
    // Everything else went for the newest prompt: nothing stays locked for ever.
    expect(cache.match(seq(1, 2, 3, 4)).length).toBe(0);
    expect(cache.size).toBe(6);
  });

  it('reuses a plain answer in the next turn, but not a thinking one', () => {
    const system = { role: 'system', content: 'You are terse.' };
    const turn1 = [system, { role: 'user', content: 'What is a radix tree?' }];
    const answer = 'A compressed trie.';
    const turn2 = [...turn1, { role: 'assistant', content: answer }, { role: 'user', content: 'And a trie?' }];
    const previous = promptSequence(turn1);

    const plain = new PrefixCache(() => 10_000);
    plain.insert([...previous, ...answerSequence(null, answer)]);
    const plainHit = plain.match(promptSequence(turn2)).length;

    const thinking = new PrefixCache(() => 10_000);
    thinking.insert([...previous, ...answerSequence('Let me think about tries.', answer)]);
    const thinkingHit = thinking.match(promptSequence(turn2)).length;

    // Thinking: the previous prompt, up to the assistant header; plain: its answer and <|im_end|> too.
    expect(thinkingHit).toBe(previous.length);
    expect(plainHit).toBe(previous.length + answerSequence(null, answer).length);
  });
});
