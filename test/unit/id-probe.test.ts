import { describe, expect, it } from 'vitest';
import { readStream } from '../../src/runner/id-probe.js';
import { pickIds } from '../../src/runner/token-ids.js';

// The id probe reads a streamed answer as the runner reads streams (runner/sse.ts): a proxy that
// frames vLLM's events with CRLF must not make regen ask that endpoint unstreamed, losing the loop watch.

const EVENTS = [
  { id: 'x', object: 'chat.completion.chunk', prompt_token_ids: [1, 2, 3], choices: [{ index: 0, delta: { role: 'assistant', content: '' }, token_ids: [] }] },
  {
    id: 'x',
    object: 'chat.completion.chunk',
    choices: [{ index: 0, delta: { content: 'OK' }, token_ids: [7], finish_reason: 'stop' }],
    usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
  },
];

describe('the id probe reading a stream', () => {
  for (const [framing, eol] of [
    ['LF', '\n'],
    ['CRLF', '\r\n'],
    ['CR', '\r'],
  ] as const) {
    it(`finds vLLM's streamed ids in events framed with ${framing}`, () => {
      const text = [...EVENTS.map((e) => `data: ${JSON.stringify(e)}`), 'data: [DONE]'].map((line) => `${line}${eol}${eol}`).join('');
      expect(pickIds(readStream(text), 'streamed_token_ids', 1)).toEqual({ prompt: [1, 2, 3], outputs: [[7]] });
    });
  }
});
