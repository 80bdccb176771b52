import { describe, expect, it } from 'vitest';
import { type Piece, type Reply, streamPiece, streamTail } from '../../src/sim/completion.js';

// A streamed token's event is written from a template (src/sim/completion.ts): it must stay the
// text a chat.completion.chunk of SGLang's shape serializes to, key for key, as the events written
// whole (the head's, the finish's) are.

const body = { id: 'chatcmpl-"q"', created: 1765000000, model: 'org/Model "x" \u2028', choices: [{ finish_reason: 'stop', matched_stop: null }], usage: {} };
const reply = { body, pieces: [] } as unknown as Reply;

/** The event as the whole object serializes, in SGLang's key order. */
function expected(piece: Piece): string {
  const choice: Record<string, unknown> = {
    index: piece.index,
    delta: { role: null, content: null, reasoning_content: null, tool_calls: null, [piece.field]: piece.text },
    logprobs: null,
    finish_reason: null,
    matched_stop: null,
  };
  if (piece.tokenIds) choice.token_ids = piece.tokenIds;
  return `data: ${JSON.stringify({ id: body.id, object: 'chat.completion.chunk', created: body.created, model: body.model, choices: [choice], usage: null })}\n\n`;
}

const TEXTS = ['a', ' two words', 'quote " and \\ backslash', 'ünï\u2028\n\t', 'lone \ud800 half', '😀'];

describe("the simulator's streamed events", () => {
  it('write each piece of content or reasoning as its whole chunk object serializes', () => {
    let compared = 0;
    for (const field of ['content', 'reasoning_content'] as const)
      for (const text of TEXTS)
        for (const index of [0, 2])
          for (const tokenIds of [undefined, [], [7, 300_000]]) {
            const piece: Piece = { index, field, text, tokenIds };
            expect(streamPiece(reply, piece)).toBe(expected(piece));
            compared++;
          }
    expect(compared).toBe(72);
  });

  it('send nothing for an empty piece, and begin every event with the same head as the finish event', () => {
    expect(streamPiece(reply, { index: 0, field: 'content', text: '' })).toBe('');
    const piece = streamPiece(reply, { index: 0, field: 'content', text: 'x' });
    const finish = streamTail(reply, false);
    const head = piece.slice(0, piece.indexOf('"choices":['));
    expect(head.length).toBeGreaterThan(0);
    expect(finish.startsWith(head)).toBe(true);
    expect(JSON.parse(piece.slice('data: '.length))).toMatchObject({ id: body.id, model: body.model, choices: [{ delta: { content: 'x' } }] });
  });
});
