import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { losesNumbers, mayLoseNumbers } from '../src/domain/exact-json.js';
import { seededRandom } from '../src/domain/forecast.js';
import { parseInputLine, readLines, type RawLine } from '../src/domain/input-line.js';

const keep = { regenerate: null } as const;
const regen = { regenerate: 'last_assistant' } as const;

const parse = (line: unknown, opts: { regenerate: 'last_assistant' | 'all_assistant' | null } = keep, lineNo = 7) =>
  parseInputLine(typeof line === 'string' ? line : JSON.stringify(line), lineNo, opts);

const reasonOf = (line: unknown, opts: { regenerate: 'last_assistant' | null } = keep) => {
  const parsed = parse(line, opts);
  if (parsed.ok) throw new Error(`expected a bad line, got ${JSON.stringify(parsed)}`);
  return parsed.reason;
};

const user = { role: 'user', content: 'What is 2 + 2?' };
const assistant = { role: 'assistant', content: 'OK.' };

describe('parseInputLine: formats', () => {
  it('reads a native line with params', () => {
    expect(parse({ custom_id: 'a1', messages: [user], params: { temperature: 0.6, max_tokens: 100 } })).toEqual({
      ok: true,
      old_answer_chars: null,
      metadata: null,
      custom_id: 'a1',
      messages: [user],
      params: { temperature: 0.6, max_tokens: 100 },
      model: null,
    });
  });

  it('reads a native line without params', () => {
    expect(parse({ custom_id: 'a1', messages: [user] })).toEqual({
      ok: true,
      old_answer_chars: null,
      metadata: null,
      custom_id: 'a1',
      messages: [user],
      params: null,
      model: null,
    });
  });

  it('moves a model in native params to the model field', () => {
    expect(parse({ custom_id: 'a1', messages: [user], params: { model: 'qwen3-27b', seed: 1 } })).toMatchObject({
      params: { seed: 1 },
      model: 'qwen3-27b',
    });
    expect(parse({ custom_id: 'a1', messages: [user], params: { model: 'qwen3-27b' } })).toMatchObject({
      params: null,
      model: 'qwen3-27b',
    });
  });

  it('reads an OpenAI batch line: body minus messages and model becomes params', () => {
    const line = {
      custom_id: 'req-1',
      method: 'POST',
      url: '/v1/chat/completions',
      body: { model: 'qwen3-27b', messages: [user], max_tokens: 1000, chat_template_kwargs: { enable_thinking: true } },
    };
    expect(parse(line)).toEqual({
      ok: true,
      old_answer_chars: null,
      metadata: null,
      custom_id: 'req-1',
      messages: [user],
      params: { max_tokens: 1000, chat_template_kwargs: { enable_thinking: true } },
      model: 'qwen3-27b',
    });
  });

  it('gives a batch line with nothing but messages null params and model', () => {
    const line = { custom_id: 'r', method: 'POST', url: '/v1/chat/completions', body: { messages: [user] } };
    expect(parse(line)).toMatchObject({ ok: true, params: null, model: null });
  });

  it('reads a ShareGPT line, mapping roles', () => {
    const line = {
      id: 'sg-1',
      conversations: [
        { from: 'system', value: 'You are helpful.' },
        { from: 'human', value: 'Hi' },
        { from: 'gpt', value: 'Hello!' },
        { from: 'user', value: 'Again' },
        { from: 'assistant', value: 'Hello again!' },
        { from: 'tool', value: '{}' },
      ],
    };
    expect(parse(line)).toEqual({
      ok: true,
      old_answer_chars: null,
      metadata: null,
      custom_id: 'sg-1',
      messages: [
        { role: 'system', content: 'You are helpful.' },
        { role: 'user', content: 'Hi' },
        { role: 'assistant', content: 'Hello!' },
        { role: 'user', content: 'Again' },
        { role: 'assistant', content: 'Hello again!' },
        { role: 'tool', content: '{}' },
      ],
      params: null,
      model: null,
    });
  });

  it('reads a plain prompt line as one user message', () => {
    expect(parse({ id: 'p1', prompt: 'Write a haiku.' })).toEqual({
      ok: true,
      old_answer_chars: null,
      metadata: null,
      custom_id: 'p1',
      messages: [{ role: 'user', content: 'Write a haiku.' }],
      params: null,
      model: null,
    });
  });

  it('accepts per-line params on ShareGPT and plain lines too', () => {
    expect(parse({ id: 'p1', prompt: 'Hi', params: { seed: 3 } })).toMatchObject({ params: { seed: 3 } });
    expect(parse({ id: 's', conversations: [{ from: 'human', value: 'Hi' }], params: { seed: 3 } })).toMatchObject({
      params: { seed: 3 },
    });
  });

  it('keeps extra message fields and content-part arrays', () => {
    const messages = [
      { role: 'system', content: 'Be brief.', name: 'sys' },
      {
        role: 'user',
        content: [
          { type: 'text', text: 'What is this?' },
          { type: 'image_url', image_url: { url: 'https://example.com/x.png' } },
        ],
      },
      { role: 'assistant', content: null, tool_calls: [{ id: 't1', type: 'function', function: { name: 'f', arguments: '{}' } }] },
      { role: 'tool', content: '42', tool_call_id: 't1' },
    ];
    expect(parse({ custom_id: 'x', messages })).toMatchObject({ ok: true, messages });
  });

  it('strips a trailing carriage return', () => {
    expect(parse(`${JSON.stringify({ custom_id: 'a', messages: [user] })}\r`)).toMatchObject({ ok: true, custom_id: 'a' });
  });
});

describe('parseInputLine: custom_id', () => {
  it('falls back to id, then to line-<n>', () => {
    expect(parse({ id: 'from-id', messages: [user] })).toMatchObject({ custom_id: 'from-id' });
    expect(parse({ custom_id: 'cid', id: 'other', messages: [user] })).toMatchObject({ custom_id: 'cid' });
    expect(parseInputLine(JSON.stringify({ messages: [user] }), 42, keep)).toMatchObject({ custom_id: 'line-42' });
    expect(parseInputLine(JSON.stringify({ custom_id: null, id: null, prompt: 'x' }), 3, keep)).toMatchObject({
      custom_id: 'line-3',
    });
  });

  it('converts a numeric id to a string', () => {
    expect(parse({ id: 12345, prompt: 'x' })).toMatchObject({ custom_id: '12345' });
    expect(parse({ id: 0, prompt: 'x' })).toMatchObject({ custom_id: '0' });
  });

  it('keeps a numeric id as its literal: past 2^53, -0 and 1e21 as written', () => {
    const idOf = (literal: string) => parse(`{"id":${literal},"prompt":"x"}`);
    expect(idOf('9007199254740993')).toMatchObject({ custom_id: '9007199254740993' });
    expect(idOf('9007199254740992')).toMatchObject({ custom_id: '9007199254740992' });
    expect(idOf('-0')).toMatchObject({ custom_id: '-0' });
    expect(idOf('0')).toMatchObject({ custom_id: '0' });
    expect(idOf('1e21')).toMatchObject({ custom_id: '1e21' });
    expect(idOf(' 1.50 ')).toMatchObject({ custom_id: '1.50' });
    // A refused line still names its own id exactly.
    expect(parse('{"id":12345678901234567890,"messages":[]}')).toMatchObject({ ok: false, custom_id: '12345678901234567890' });
  });

  it('keeps the line’s own fields as it wrote them, and a __proto__ field as a field', () => {
    const line = '{"id":1,"prompt":"x","big":9007199254740993, "neg":-0,"huge":1e400,"s":"a \\"q\\" [{,:1.0}]","n":{"a":[1e21,{"b":"}"}]}}';
    const parsed = parse(line);
    expect(parsed).toMatchObject({
      ok: true,
      custom_id: '1',
      exact_metadata: { big: '9007199254740993', neg: '-0', huge: '1e400', s: '"a \\"q\\" [{,:1.0}]"', n: '{"a":[1e21,{"b":"}"}]}' },
    });
    const proto = parse('{"prompt":"x","__proto__":{"polluted":true}}');
    expect(proto.ok && Object.hasOwn(proto.metadata!, '__proto__')).toBe(true);
    expect(proto.ok && JSON.stringify(proto.metadata)).toBe('{"__proto__":{"polluted":true}}');
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    // A line whose numbers write back as written keeps today's form.
    const plain = parse({ id: 3, prompt: 'x', params: { temperature: 0.7 }, meta: { row: 12, score: 0.25 } });
    expect(plain).toMatchObject({ ok: true, custom_id: '3', metadata: { meta: { row: 12, score: 0.25 } } });
    expect(plain).not.toHaveProperty('exact_metadata');
  });

  it('the quick test misses no number that parsing changes', () => {
    const random = seededRandom('exact-numbers');
    const digits = (n: number) => Array.from({ length: n }, () => Math.floor(random() * 10)).join('');
    let changed = 0;
    for (let i = 0; i < 20_000; i++) {
      const int = random() < 0.3 ? '0' : `${1 + Math.floor(random() * 9)}${digits(Math.floor(random() * 24))}`;
      const frac = random() < 0.5 ? '' : `.${digits(1 + Math.floor(random() * 20))}`;
      const exp = random() < 0.8 ? '' : `${random() < 0.5 ? 'e' : 'E'}${['', '+', '-'][Math.floor(random() * 3)]}${digits(1 + Math.floor(random() * 3))}`;
      const literal = `${random() < 0.3 ? '-' : ''}${int}${frac}${exp}`;
      if (String(Number(literal)) === literal) continue;
      changed++;
      expect(mayLoseNumbers(`{"k":${literal}}`), literal).toBe(true);
      expect(losesNumbers(literal), literal).toBe(true);
    }
    expect(changed).toBeGreaterThan(1000);
  });

  it('rejects ids of the wrong type', () => {
    expect(reasonOf({ custom_id: 5, messages: [user] })).toBe('custom_id must be a string');
    expect(reasonOf({ custom_id: ['a'], messages: [user] })).toBe('custom_id must be a string');
    expect(reasonOf({ id: true, prompt: 'x' })).toBe('id must be a string or a number');
    expect(reasonOf({ id: { a: 1 }, prompt: 'x' })).toBe('id must be a string or a number');
  });

  it('rejects empty, overlong and control-character ids', () => {
    expect(reasonOf({ custom_id: '', messages: [user] })).toBe('custom_id must not be empty');
    expect(parse({ custom_id: 'x'.repeat(512), messages: [user] })).toMatchObject({ ok: true });
    expect(reasonOf({ custom_id: 'x'.repeat(513), messages: [user] })).toBe('custom_id is longer than 512 characters');
    expect(reasonOf({ custom_id: 'a\nb', messages: [user] })).toBe('custom_id must not contain control characters');
    expect(reasonOf({ custom_id: 'a\u0000b', messages: [user] })).toBe('custom_id: must not contain the NUL character (\\u0000)');
    expect(reasonOf({ custom_id: 'a\u007fb', messages: [user] })).toBe('custom_id must not contain control characters');
    expect(reasonOf({ id: 'tab\there', prompt: 'x' })).toBe('id must not contain control characters');
    expect(parse({ custom_id: 'ünïcødé-✓-🙂', messages: [user] })).toMatchObject({ custom_id: 'ünïcødé-✓-🙂' });
  });
});

describe('parseInputLine: bad lines', () => {
  it('reports an empty line', () => {
    expect(reasonOf('')).toBe('empty line');
    expect(reasonOf('   \r')).toBe('empty line');
  });

  it('reports invalid JSON with a short parser message', () => {
    const reason = reasonOf('{"custom_id": "a", "messages": [}');
    expect(reason).toMatch(/^not valid JSON: /);
    expect(reason).not.toMatch(/\n\s+at /);
    expect(reasonOf('{"a": 1')).toMatch(/^not valid JSON: /);
    const long = reasonOf(`{"x": "${'y'.repeat(100_000)}`);
    expect(long).toMatch(/^not valid JSON: /);
    expect(long.length).toBeLessThan(200);
  });

  it('handles deeply nested JSON without crashing', () => {
    const depth = 200_000;
    const parsed = parse(`{"custom_id":"deep","messages":${'['.repeat(depth)}${']'.repeat(depth)}}`);
    // Whether the engine parses it or gives up, the answer is a clean reason, not a throw.
    expect(parsed.ok).toBe(false);
    if (!parsed.ok) expect(parsed.reason).toMatch(/^(not valid JSON: nesting too deep|line is nested more than 100 levels deep)$/);
  });

  it('reports a line that is not an object', () => {
    for (const line of ['[1, 2]', '"text"', '42', 'null', 'true']) {
      expect(reasonOf(line)).toBe('line is not a JSON object');
    }
  });

  it('reports a line without messages', () => {
    expect(reasonOf({ custom_id: 'a', text: 'hello' })).toBe('no messages: expected "messages", "body.messages", "conversations" or "prompt"');
  });

  it('reports bad messages with their path', () => {
    expect(reasonOf({ messages: [] })).toBe('messages must be a non-empty array');
    expect(reasonOf({ messages: 'hi' })).toBe('messages must be a non-empty array');
    expect(reasonOf({ messages: null })).toBe('messages must be a non-empty array');
    expect(reasonOf({ messages: [user, 'hi'] })).toBe('messages[1] must be an object');
    expect(reasonOf({ messages: [user, user, user, { content: 'x' }] })).toBe('messages[3].role must be a string');
    expect(reasonOf({ messages: [user, { role: 7, content: 'x' }] })).toBe('messages[1].role must be a string');
    expect(reasonOf({ messages: [user, user, { role: 'user', content: 5 }] })).toBe('messages[2].content must be a string or an array of content parts');
    expect(reasonOf({ messages: [{ role: 'user' }] })).toBe('messages[0].content must be a string or an array of content parts');
    expect(reasonOf({ messages: [{ role: 'user', content: null }] })).toBe('messages[0].content must be a string or an array of content parts');
    expect(reasonOf({ messages: [{ role: 'assistant', content: null }] })).toBe('messages[0].content must be a string or an array of content parts');
    expect(reasonOf({ messages: [{ role: 'user', content: [{ type: 'text', text: 'a' }, 'b'] }] })).toBe(
      'messages[0].content[1] must be a content part: an object with a string "type"',
    );
  });

  it('reports bad params', () => {
    expect(reasonOf({ messages: [user], params: [1] })).toBe('params must be an object');
    expect(reasonOf({ messages: [user], params: 'hot' })).toBe('params must be an object');
    expect(reasonOf({ messages: [user], params: { model: 3 } })).toBe('params.model must be a string');
    expect(parse({ messages: [user], params: null })).toMatchObject({ ok: true, params: null });
  });

  it('reports bad batch lines', () => {
    const good = { custom_id: 'r', method: 'POST', url: '/v1/chat/completions', body: { messages: [user] } };
    expect(reasonOf({ ...good, url: '/v1/completions' })).toBe(`url "/v1/completions" differs from the batch's endpoint "/v1/chat/completions"`);
    expect(reasonOf({ ...good, url: undefined })).toBe(`url must be a string: the batch's endpoint, "/v1/chat/completions"`);
    expect(reasonOf({ ...good, method: 'GET' })).toBe('method must be "POST"');
    expect(reasonOf({ ...good, body: 'x' })).toBe('body must be an object');
    expect(reasonOf({ ...good, body: { model: 'm' } })).toBe('body.messages must be a non-empty array');
    expect(reasonOf({ ...good, body: { messages: [{ role: 'user', content: 1 }] } })).toBe(
      'body.messages[0].content must be a string or an array of content parts',
    );
    expect(reasonOf({ ...good, body: { messages: [user], model: 1 } })).toBe('body.model must be a string');
  });

  it('reports bad ShareGPT lines', () => {
    expect(reasonOf({ id: 's', conversations: [] })).toBe('conversations must be a non-empty array');
    expect(
      reasonOf({
        id: 's',
        conversations: [
          { from: 'human', value: 'a' },
          { from: 'foo', value: 'b' },
        ],
      }),
    ).toBe(
      'conversations[1].from "foo" is not a ShareGPT role: use one of "system", "human", "user", "gpt", "assistant", "tool", "observation", "function_call"',
    );
    expect(reasonOf({ id: 's', conversations: [{ value: 'a' }] })).toBe('conversations[0].from must be a string');
    expect(reasonOf({ id: 's', conversations: [{ from: 'human', value: ['a'] }] })).toBe('conversations[0].value must be a string');
    expect(reasonOf({ id: 's', conversations: [null] })).toBe('conversations[0] must be an object');
  });

  it("refuses roles other than OpenAI's chat roles, naming the message and the role to write", () => {
    const refused = (role: string) => parse({ custom_id: 'r', messages: [user, { role, content: 'x' }] });
    expect(refused('human')).toEqual({ ok: false, code: 'invalid_role', custom_id: 'r', reason: 'messages[1].role "human" is not a chat role: write "user"' });
    expect(refused('gpt')).toMatchObject({ reason: 'messages[1].role "gpt" is not a chat role: write "assistant"' });
    expect(refused('model')).toMatchObject({ reason: 'messages[1].role "model" is not a chat role: write "assistant"' });
    expect(refused('narrator')).toMatchObject({
      code: 'invalid_role',
      reason: 'messages[1].role "narrator" is not a chat role: use one of "system", "developer", "user", "assistant", "tool"',
    });
    expect(reasonOf({ custom_id: 'b', method: 'POST', url: '/v1/chat/completions', body: { messages: [{ role: 'Human', content: 'x' }] } })).toBe(
      'body.messages[0].role "Human" is not a chat role: write "user"',
    );
    for (const role of ['system', 'developer', 'user', 'assistant', 'tool']) expect(refused(role)).toMatchObject({ ok: true });
  });

  it("maps LLaMA-Factory's ShareGPT observation turns to tool turns", () => {
    const line = {
      id: 'o',
      conversations: [
        { from: 'human', value: 'weather?' },
        { from: 'observation', value: '{"t": 20}' },
      ],
    };
    expect(parse(line)).toMatchObject({ ok: true, messages: [{ role: 'user' }, { role: 'tool', content: '{"t": 20}' }] });
  });

  it('refuses params SGLang would ignore where they stand, saying where they belong', () => {
    expect(reasonOf({ custom_id: 'p', messages: [user], params: { enable_thinking: false } })).toBe(
      'params.enable_thinking: belongs in chat_template_kwargs, as {"chat_template_kwargs": {"enable_thinking": false}}: only those reach the chat template, and SGLang ignores it at the top level',
    );
    expect(reasonOf({ custom_id: 'p', method: 'POST', url: '/v1/chat/completions', body: { messages: [user], enable_thinking: true } })).toMatch(
      /^body\.enable_thinking: belongs in chat_template_kwargs, as \{"chat_template_kwargs": \{"enable_thinking": true\}\}/,
    );
    expect(reasonOf({ custom_id: 'p', messages: [user], params: { extra_body: { top_k: 20 } } })).toMatch(
      /^params\.extra_body: .*write its fields in params directly/,
    );
    expect(reasonOf({ custom_id: 'p', messages: [user], params: { chat_template_kwargs: { enable_thinking: 'false' } } })).toMatch(
      /^params\.chat_template_kwargs\.enable_thinking: must be true or false/,
    );
    expect(parse({ custom_id: 'p', messages: [user], params: { chat_template_kwargs: { enable_thinking: false } } })).toMatchObject({ ok: true });
  });

  it('reports bad prompts', () => {
    expect(reasonOf({ id: 'p', prompt: '' })).toBe('prompt must be a non-empty string');
    expect(reasonOf({ id: 'p', prompt: '  ' })).toBe('prompt must be a non-empty string');
    expect(reasonOf({ id: 'p', prompt: 5 })).toBe('prompt must be a non-empty string');
  });
});

describe('parseInputLine: regenerate last_assistant', () => {
  it('drops a trailing assistant turn', () => {
    expect(parse({ custom_id: 'a', messages: [user, assistant] }, regen)).toMatchObject({ messages: [user] });
    const sharegpt = {
      id: 's',
      conversations: [
        { from: 'human', value: 'Hi' },
        { from: 'gpt', value: 'OK.' },
      ],
    };
    expect(parse(sharegpt, regen)).toMatchObject({ messages: [{ role: 'user', content: 'Hi' }] });
  });

  it('drops only the last message, and only when it is an assistant turn', () => {
    const messages = [user, assistant, user, assistant];
    expect(parse({ custom_id: 'a', messages }, regen)).toMatchObject({ messages: messages.slice(0, 3) });
    expect(parse({ custom_id: 'a', messages: [user, assistant, user] }, regen)).toMatchObject({
      messages: [user, assistant, user],
    });
  });

  it('keeps the assistant turn when regenerate is not set', () => {
    expect(parse({ custom_id: 'a', messages: [user, assistant] }, keep)).toMatchObject({ messages: [user, assistant] });
  });

  it('takes a dropped assistant turn with content null and no tool calls: it is discarded, not sent', () => {
    const empty = { role: 'assistant', content: null };
    expect(parse({ custom_id: 'a', messages: [user, empty] }, regen)).toMatchObject({ ok: true, messages: [user], old_answer_chars: 0 });
    expect(parse({ id: 'c', conversations: [{ role: 'user', content: 'Hi' }, empty] }, regen)).toMatchObject({
      ok: true,
      messages: [{ role: 'user', content: 'Hi' }],
    });
    expect(parse({ custom_id: 'w', messages: [user, empty, user, empty] }, { regenerate: 'all_assistant' })).toMatchObject({
      ok: true,
      messages: [user, user],
      turns: 2,
    });
    // One that is kept (not last, or nothing is regenerated) is sent, so it must hold something.
    expect(reasonOf({ custom_id: 'a', messages: [user, empty, user] }, regen)).toBe('messages[1].content must be a string or an array of content parts');
    expect(reasonOf({ custom_id: 'a', messages: [user, empty] }, keep)).toBe('messages[1].content must be a string or an array of content parts');
  });

  it('reports a conversation that is only an assistant turn', () => {
    expect(reasonOf({ custom_id: 'a', messages: [assistant] }, regen)).toBe('nothing left to send after dropping the last assistant turn');
  });
});

// ---------------------------------------------------------------------------------------

const bytes = (s: string) => new TextEncoder().encode(s);

async function* chunks(...parts: (string | Uint8Array)[]): AsyncGenerator<Uint8Array> {
  for (const part of parts) yield typeof part === 'string' ? bytes(part) : part;
}

async function collect(source: AsyncIterable<Uint8Array>, maxLineBytes = 1024): Promise<RawLine[]> {
  const lines: RawLine[] = [];
  for await (const line of readLines(source, { maxLineBytes })) lines.push(line);
  return lines;
}

describe('readLines', () => {
  it('splits lines and numbers them from 1', async () => {
    expect(await collect(chunks('a\nbb\n\nccc\n'))).toEqual([
      { lineNo: 1, text: 'a' },
      { lineNo: 2, text: 'bb' },
      { lineNo: 3, text: '' },
      { lineNo: 4, text: 'ccc' },
    ]);
  });

  it('yields a final line without a trailing newline', async () => {
    expect(await collect(chunks('a\nlast'))).toEqual([
      { lineNo: 1, text: 'a' },
      { lineNo: 2, text: 'last' },
    ]);
  });

  it('yields nothing for an empty input', async () => {
    expect(await collect(chunks())).toEqual([]);
    expect(await collect(chunks('', ''))).toEqual([]);
  });

  it('joins lines split across chunks', async () => {
    expect(await collect(chunks('he', 'llo', '\nwor', 'ld\n', '\n', 'x'))).toEqual([
      { lineNo: 1, text: 'hello' },
      { lineNo: 2, text: 'world' },
      { lineNo: 3, text: '' },
      { lineNo: 4, text: 'x' },
    ]);
  });

  it('gives the same lines however the input is chunked', async () => {
    const input = bytes('{"id":1,"prompt":"héllo 🙂"}\r\n\n{"id":2,"prompt":"日本語"}\nend');
    const expected = await collect(chunks(input));
    for (const size of [1, 2, 3, 5, 7]) {
      const pieces: Uint8Array[] = [];
      for (let i = 0; i < input.length; i += size) pieces.push(input.subarray(i, i + size));
      expect(await collect(chunks(...pieces))).toEqual(expected);
    }
    expect(expected.map((l) => ('text' in l ? l.text : l.error))).toEqual(['{"id":1,"prompt":"héllo 🙂"}\r', '', '{"id":2,"prompt":"日本語"}', 'end']);
  });

  it('decodes a multi-byte character split across chunks', async () => {
    const emoji = bytes('🙂'); // 4 bytes
    const euro = bytes('€'); // 3 bytes
    const lines = await collect(
      chunks(bytes('a'), emoji.subarray(0, 1), emoji.subarray(1, 3), emoji.subarray(3), bytes('\nb'), euro.subarray(0, 2), euro.subarray(2)),
    );
    expect(lines).toEqual([
      { lineNo: 1, text: 'a🙂' },
      { lineNo: 2, text: 'b€' },
    ]);
  });

  it('reports bytes that are not UTF-8 and carries on', async () => {
    const bad = Uint8Array.from([0x7b, 0xff, 0xfe, 0x7d]);
    const truncated = bytes('é').subarray(0, 1);
    const overlong = Uint8Array.from([0xc0, 0xaf]);
    const lines = await collect(chunks('ok\n', bad, '\n', truncated, '\n', overlong, '\nfine'));
    expect(lines).toEqual([
      { lineNo: 1, text: 'ok' },
      { lineNo: 2, error: 'not valid UTF-8' },
      { lineNo: 3, error: 'not valid UTF-8' },
      { lineNo: 4, error: 'not valid UTF-8' },
      { lineNo: 5, text: 'fine' },
    ]);
  });

  it('drops a UTF-8 BOM at the start of the input only', async () => {
    const bom = Uint8Array.from([0xef, 0xbb, 0xbf]);
    expect(await collect(chunks(bom, 'a\nb'))).toEqual([
      { lineNo: 1, text: 'a' },
      { lineNo: 2, text: 'b' },
    ]);
    expect(await collect(chunks(bom.subarray(0, 1), bom.subarray(1), 'a'))).toEqual([{ lineNo: 1, text: 'a' }]);
    expect(await collect(chunks('a\n', bom, 'b'))).toEqual([
      { lineNo: 1, text: 'a' },
      { lineNo: 2, text: '\ufeffb' },
    ]);
  });

  it('reports a line over maxLineBytes once and skips to its newline', async () => {
    const lines = await collect(chunks('short\n', 'x'.repeat(11), '\nnext\n', 'y'.repeat(6), 'y'.repeat(6), 'y', '\nz'), 10);
    expect(lines).toEqual([
      { lineNo: 1, text: 'short' },
      { lineNo: 2, error: 'line is longer than 10 bytes' },
      { lineNo: 3, text: 'next' },
      { lineNo: 4, error: 'line is longer than 10 bytes' },
      { lineNo: 5, text: 'z' },
    ]);
  });

  it('accepts a line of exactly maxLineBytes, in one chunk or several', async () => {
    expect(await collect(chunks('x'.repeat(10), '\n', 'y'.repeat(4), 'y'.repeat(6)), 10)).toEqual([
      { lineNo: 1, text: 'x'.repeat(10) },
      { lineNo: 2, text: 'y'.repeat(10) },
    ]);
  });

  it('reports an overlong last line without a newline', async () => {
    expect(await collect(chunks('a\n', 'x'.repeat(20)), 10)).toEqual([
      { lineNo: 1, text: 'a' },
      { lineNo: 2, error: 'line is longer than 10 bytes' },
    ]);
  });

  it('keeps memory bounded on a 50 MB single line', async () => {
    const chunkBytes = 64 * 1024;
    const totalBytes = 50 * 1024 * 1024;
    async function* hugeLine(): AsyncGenerator<Uint8Array> {
      yield bytes('first\n');
      // A fresh chunk each time, as a file stream gives: keeping them would show as retained memory.
      for (let sent = 0; sent < totalBytes; sent += chunkBytes) yield new Uint8Array(chunkBytes).fill(0x61);
      yield bytes('\nafter\n{"id":3}');
    }
    const gc = exposeGc();
    gc();
    const before = process.memoryUsage();
    let peakRetained = 0;
    let peakRss = 0;
    const probe = () => {
      // Collect first, so what is measured is what readLines keeps, not garbage not yet swept.
      gc();
      const now = process.memoryUsage();
      peakRetained = Math.max(peakRetained, now.heapUsed + now.arrayBuffers - before.heapUsed - before.arrayBuffers);
      peakRss = Math.max(peakRss, now.rss - before.rss);
    };
    const lines: RawLine[] = [];
    for await (const line of readLines(probeEvery(hugeLine(), 64, probe), { maxLineBytes: 1024 * 1024 })) {
      probe();
      lines.push(line);
    }
    expect(lines).toEqual([
      { lineNo: 1, text: 'first' },
      { lineNo: 2, error: 'line is longer than 1048576 bytes' },
      { lineNo: 3, text: 'after' },
      { lineNo: 4, text: '{"id":3}' },
    ]);
    expect(peakRetained).toBeLessThan(8 * 1024 * 1024);
    expect(peakRss).toBeLessThan(40 * 1024 * 1024);
  });

  it('reads 1M empty lines quickly', async () => {
    const start = performance.now();
    let count = 0;
    let lastLineNo = 0;
    const block = new Uint8Array(64 * 1024).fill(0x0a);
    async function* newlines(): AsyncGenerator<Uint8Array> {
      let left = 1_000_000;
      while (left > 0) {
        const n = Math.min(left, block.length);
        yield block.subarray(0, n);
        left -= n;
      }
    }
    for await (const line of readLines(newlines(), { maxLineBytes: 1024 })) {
      count++;
      lastLineNo = line.lineNo;
    }
    expect(count).toBe(1_000_000);
    expect(lastLineNo).toBe(1_000_000);
    expect(performance.now() - start).toBeLessThan(30_000);
  });

  it('reads 1M short JSON lines quickly', async () => {
    const linesPerBlock = 1000;
    const block = bytes('{"custom_id":"abc-000","prompt":"What is 2 + 2?"}\n'.repeat(linesPerBlock));
    const split = 1234; // mid-line, so one line of every block crosses a chunk boundary
    async function* input(): AsyncGenerator<Uint8Array> {
      for (let i = 0; i < 1_000_000 / linesPerBlock; i++) {
        yield block.subarray(0, split);
        yield block.subarray(split);
      }
    }
    const start = performance.now();
    let count = 0;
    let errors = 0;
    for await (const raw of readLines(input(), { maxLineBytes: 1024 })) {
      count++;
      if ('error' in raw) errors++;
    }
    expect(errors).toBe(0);
    expect(count).toBe(1_000_000);
    expect(performance.now() - start).toBeLessThan(30_000);
  });
});

/** Passes chunks through, calling `probe` every `every` chunks and at the end. */
async function* probeEvery(source: AsyncIterable<Uint8Array>, every: number, probe: () => void): AsyncGenerator<Uint8Array> {
  let n = 0;
  for await (const chunk of source) {
    if (n++ % every === 0) probe();
    yield chunk;
  }
  probe();
}

/** The engine's collector, so a memory test measures what is kept rather than what is not yet swept. */
function exposeGc(): () => void {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  // The flag is the process's: files that run after this one in it get it unset again.
  setFlagsFromString('--no-expose-gc');
  return gc;
}
