import { describe, expect, it } from 'vitest';
import { jsonTextNestsDeeperThan, MAX_JSON_DEPTH, nestsDeeperThan } from '../../src/domain/json-depth.js';

const nested = (levels: number) => `${'['.repeat(levels)}${']'.repeat(levels)}`;

describe('jsonTextNestsDeeperThan', () => {
  it('reads the depth of the text as JSON.parse would build it', () => {
    for (const levels of [1, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 100_000]) {
      const text = `{"a":${nested(levels)}}`;
      expect(jsonTextNestsDeeperThan(text)).toBe(nestsDeeperThan(JSON.parse(text)));
    }
    expect(jsonTextNestsDeeperThan(nested(3), 2)).toBe(true);
    expect(jsonTextNestsDeeperThan(`[${nested(2)},${nested(2)}]`, 3)).toBe(false);
  });

  it('counts no bracket inside a string, whatever its escapes', () => {
    const strings = ['[[[[', '\\"[[[[', '\\\\', '\\\\\\"{{{', '\u{1F600}[', '\\u005b\\u005b\\u005b'];
    for (const s of strings) {
      const text = `{"k${s}":["${s}"]}`;
      expect(() => JSON.parse(text)).not.toThrow();
      expect(jsonTextNestsDeeperThan(text, 2)).toBe(false);
    }
    // After an escaped backslash the quote closes the string: the brackets after it count.
    expect(jsonTextNestsDeeperThan('["\\\\",[[]]]', 2)).toBe(true);
  });

  it('ends on text cut inside a string', () => {
    expect(jsonTextNestsDeeperThan('[["abc', 1)).toBe(true);
    expect(jsonTextNestsDeeperThan('["[[[[', 1)).toBe(false);
  });
});
