import { describe, expect, it } from 'vitest';
import { EventStreamParser } from '../../src/runner/sse.js';

/** Every event's data from `stream`, fed in pieces of `size` characters. */
function read(stream: string, size: number): string[] {
  const parser = new EventStreamParser();
  const out: string[] = [];
  for (let i = 0; i < stream.length; i += size) out.push(...parser.push(stream.slice(i, i + size)));
  return out;
}

describe('EventStreamParser', () => {
  const cases: [string, string, string[]][] = [
    ['LF', 'data: a\n\ndata: b\n\n', ['a', 'b']],
    ['CRLF', 'data: a\r\n\r\ndata: b\r\n\r\n', ['a', 'b']],
    ['a lone CR', 'data: a\r\rdata: b\r\r', ['a', 'b']],
    ['mixed line ends', 'data: a\r\n\ndata: b\r\r\n', ['a', 'b']],
    ['comments and keep-alives', ': ping\n\n:\ndata: a\n: inside\n\n', ['a']],
    ['multi-line data, joined with LF', 'data: {"a":\ndata:1}\n\n', ['{"a":\n1}']],
    ['no space after the colon, and only one space dropped', 'data:a\n\ndata:  b\n\n', ['a', ' b']],
    ['a field without a colon', 'data\n\ndata: a\nretry\nid\n\n', ['', 'a']],
    ['other fields are let go', 'event: x\nid: 7\nretry: 10\ndata: a\n\nevent: only\n\n', ['a']],
    ['a leading BOM', '\uFEFFdata: a\n\n', ['a']],
    ['an event without its ending empty line is not dispatched', 'data: a\n\ndata: b\n', ['a']],
    ['a colon in the value stays', 'data: {"k":"v:w"}\n\n', ['{"k":"v:w"}']],
  ];
  for (const [name, stream, want] of cases) {
    it(`${name}, however the stream is cut into chunks`, () => {
      for (const size of [1, 2, 3, 5, stream.length]) expect(read(stream, size)).toEqual(want);
    });
  }

  it('holds only what has not yet made an event', () => {
    const parser = new EventStreamParser();
    expect(parser.push('data: abc')).toEqual([]);
    expect(parser.heldChars).toBe('data: abc'.length);
    expect(parser.push('\n')).toEqual([]);
    expect(parser.heldChars).toBe('data: abc\n'.length);
    expect(parser.push('\r\n')).toEqual(['abc']);
    expect(parser.heldChars).toBe(0);
  });
});
