import { describe, expect, it } from 'vitest';
import { requestCount, type TurnRecord, turnLines, turnMessages, walk } from '../../src/domain/conversation.js';
import { flagBit, flagsFromBits } from '../../src/domain/flags.js';
import { parseInputLine } from '../../src/domain/input-line.js';
import { computeFlags } from '../../src/domain/quality.js';
import { callMarkupIn, pairStep, toolCallParser } from '../../src/domain/tools.js';
import { settleAnswer, type Attempt } from '../../src/runner/outcomes.js';
import { buildRequest, parseAnswer } from '../../src/runner/request.js';
import { StreamedAnswer } from '../../src/runner/stream-answer.js';

// The pure parts of agentic conversations: the input's tool calls, the walk that pairs the
// target's steps with the source's results, the history's reasoning, streamed calls put back
// together, and the flags a tool-call answer can carry.

const call = (id: string, name: string, args = '{}') => ({ id, type: 'function' as const, function: { name, arguments: args } });
const usage = { prompt_tokens: 10, completion_tokens: 5, reasoning_tokens: 2, cached_tokens: 0 };
const TOOLS = [{ type: 'function', function: { name: 'search' } }];

function record(idx: number, over: Partial<TurnRecord>): TurnRecord {
  return {
    idx,
    step: 0,
    content: null,
    reasoningContent: `thought ${idx}`,
    toolCalls: null,
    finishReason: 'stop',
    usage,
    endpointId: 'e',
    latencyMs: 1,
    attempts: 1,
    flags: 0,
    ...over,
  };
}

// The source: turn 0 searches twice in parallel, then fetches, then answers; turn 1 answers at once.
const source = [
  { role: 'system', content: 's' },
  { role: 'user', content: 'q0' },
  { role: 'assistant', content: null, tool_calls: [call('s1', 'search'), call('s2', 'search')] },
  { role: 'tool', content: 'r1', tool_call_id: 's1' },
  { role: 'tool', content: 'r2', tool_call_id: 's2' },
  { role: 'assistant', content: null, tool_calls: [call('s3', 'fetch')] },
  { role: 'tool', content: 'r3', tool_call_id: 's3' },
  { role: 'assistant', content: 'old answer' },
  { role: 'user', content: 'q1' },
  { role: 'assistant', content: 'old answer 1' },
];

describe('an agentic line at ingest', () => {
  it('keeps the source steps and the user turns, drops the old answers, and counts the requests', () => {
    const parsed = parseInputLine(JSON.stringify({ custom_id: 'a', messages: source, tools: TOOLS, tool_choice: 'auto' }), 1, { regenerate: 'all_assistant' });
    if (!parsed.ok) throw new Error(parsed.reason);
    expect(parsed.messages.map((m) => m.role)).toEqual(['system', 'user', 'assistant', 'tool', 'tool', 'assistant', 'tool', 'user']);
    expect(parsed.turns).toBe(4);
    expect(requestCount(parsed.messages)).toBe(4);
    // The line's tools are its params, sent with every request; not its metadata.
    expect(parsed.params).toEqual({ tools: TOOLS, tool_choice: 'auto' });
    expect(parsed.metadata).toBeNull();
  });

  it("makes ShareGPT's function_call and observation OpenAI's, with ids regen makes, and parses tools given as JSON text", () => {
    const line = {
      id: 7,
      tools: JSON.stringify(TOOLS),
      conversations: [
        { from: 'human', value: 'q' },
        {
          from: 'function_call',
          value: JSON.stringify([
            { name: 'search', arguments: { q: 1 } },
            { name: 'calc', arguments: '{"x": 2}' },
          ]),
        },
        { from: 'observation', value: 'one' },
        { from: 'observation', value: 'two' },
        { from: 'function_call', value: JSON.stringify({ name: 'fetch', arguments: {} }) },
        { from: 'observation', value: 'three' },
        { from: 'gpt', value: 'done' },
      ],
    };
    const parsed = parseInputLine(JSON.stringify(line), 3, { regenerate: null });
    if (!parsed.ok) throw new Error(parsed.reason);
    expect(parsed.messages).toEqual([
      { role: 'user', content: 'q' },
      { role: 'assistant', content: null, tool_calls: [call('call_3_0', 'search', '{"q":1}'), call('call_3_1', 'calc', '{"x": 2}')] },
      { role: 'tool', content: 'one', tool_call_id: 'call_3_0' },
      { role: 'tool', content: 'two', tool_call_id: 'call_3_1' },
      { role: 'assistant', content: null, tool_calls: [call('call_3_2', 'fetch')] },
      { role: 'tool', content: 'three', tool_call_id: 'call_3_2' },
      { role: 'assistant', content: 'done' },
    ]);
    expect(parsed.params).toEqual({ tools: TOOLS });
  });

  it('refuses broken calls and tools with the field at fault', () => {
    const bad = (line: object) => parseInputLine(JSON.stringify(line), 1, { regenerate: 'all_assistant' });
    const u = { role: 'user', content: 'q' };
    expect(bad({ messages: [u, { role: 'assistant', content: null, tool_calls: [{ id: 'x', function: { name: 'f', arguments: {} } }] }] })).toMatchObject({
      ok: false,
      reason: "messages[1].tool_calls[0].function.arguments must be a string (the arguments' JSON text)",
    });
    expect(bad({ messages: [u], tools: 'not json' })).toMatchObject({ ok: false, reason: expect.stringMatching(/^tools: /) });
    expect(bad({ messages: [u], tools: [{ type: 'function', function: {} }] })).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/^params\.tools\[0\]\.function\.name/),
    });
    expect(
      bad({
        conversations: [
          { from: 'human', value: 'q' },
          { from: 'function_call', value: '{"arguments": {}}' },
        ],
      }),
    ).toMatchObject({
      ok: false,
      reason: 'conversations[1].value: call 0 has no "name"',
    });
  });
});

describe('the walk', () => {
  const stored = (parseInputLine(JSON.stringify({ messages: source }), 1, { regenerate: 'all_assistant' }) as { messages: { role: string }[] }).messages;
  const step0 = record(0, { toolCalls: [call('t1', 'search', '{"a":1}'), call('t2', 'search')], finishReason: 'tool_calls' });
  const step1 = record(1, { step: 1, toolCalls: [call('t3', 'fetch')], finishReason: 'tool_calls' });
  const answer0 = record(2, { step: 2, content: 'new 0' });

  it("pairs each call with the source's result under the target's id, and sends the loop's reasoning only", () => {
    const sent = turnMessages(stored, [step0, step1]);
    expect(sent).toEqual([
      { role: 'system', content: 's' },
      { role: 'user', content: 'q0' },
      { role: 'assistant', content: null, reasoning_content: 'thought 0', tool_calls: step0.toolCalls },
      { role: 'tool', content: 'r1', tool_call_id: 't1' },
      { role: 'tool', content: 'r2', tool_call_id: 't2' },
      { role: 'assistant', content: null, reasoning_content: 'thought 1', tool_calls: step1.toolCalls },
      { role: 'tool', content: 'r3', tool_call_id: 't3' },
    ]);
    // The next turn: the loop is over, its reasoning no longer sent (under "loop").
    const next = turnMessages(stored, [step0, step1, answer0]);
    expect(next.filter((m) => 'reasoning_content' in m)).toEqual([]);
    expect(next.at(-1)).toEqual({ role: 'user', content: 'q1' });
    expect(turnMessages(stored, [step0, step1, answer0], { pairing: 'name', reasoning: 'all' }).filter((m) => 'reasoning_content' in m)).toHaveLength(3);
    expect(turnMessages(stored, [step0], { pairing: 'name', reasoning: 'none' }).filter((m) => 'reasoning_content' in m)).toEqual([]);
    expect(walk(stored, [step0, step1])).toMatchObject({ turn: 0, step: 2, mismatch: null, completeRequests: 0 });
    expect(walk(stored, [step0, step1, answer0])).toMatchObject({ turn: 1, step: 0, completeRequests: 3 });
  });

  it('drops source steps the target did not take, and numbers each request by its turn and step', () => {
    const direct = record(0, { content: 'no tools needed' });
    expect(walk(stored, [direct]).messages.filter((m) => m.role === 'tool')).toEqual([]);
    expect(turnLines([step0, step1, answer0]).map((t) => [t.turn, t.step, t.tool_calls])).toEqual([
      [0, 0, 2],
      [0, 1, 1],
      [0, 2, undefined],
    ]);
  });

  it('stops at a step it cannot pair: another name (under "name" only), another count, a step the source lacks', () => {
    const renamed = record(0, { toolCalls: [call('t1', 'lookup'), call('t2', 'search')] });
    expect(walk(stored, [renamed]).mismatch).toMatch(/turn 0 step 0: call 0 names "lookup" where the source called "search"/);
    expect(walk(stored, [renamed], { pairing: 'position', reasoning: 'loop' }).mismatch).toBeNull();
    expect(walk(stored, [record(0, { toolCalls: [call('t1', 'search')] })]).mismatch).toMatch(/made 1 call\(s\) where the source made 2/);
    const third = record(2, { step: 2, toolCalls: [call('t4', 'fetch')] });
    expect(walk(stored, [step0, step1, third]).mismatch).toMatch(/turn 0 step 2: the source took no such step/);
    expect(pairStep(undefined, [call('x', 'f')], 'name').ok).toBe(false);
  });
});

describe('a step settled', () => {
  const stored = (parseInputLine(JSON.stringify({ messages: source }), 1, { regenerate: 'all_assistant' }) as { messages: { role: string }[] }).messages;
  const attempt = (turn: number, history: TurnRecord[]): Attempt => ({
    sampleId: 1,
    runId: 'r',
    shardIdx: 0,
    endpointId: 'e',
    attempts: 1,
    qualityRetries: 0,
    serverFaults: 0,
    thinking: true,
    cancelled: false,
    quarantined: false,
    variant: null,
    maxTokens: null,
    contextLength: null,
    conversation: { turn, messages: stored, history },
  });
  const answer = (toolCalls: ReturnType<typeof call>[] | null, content: string | null = null) => ({
    content,
    reasoning: 'why',
    toolCalls,
    finishReason: toolCalls ? 'tool_calls' : 'stop',
    logprobs: null,
    usage,
    model: 'm',
    responseId: 'x',
    created: 1,
  });
  const run = { model: 'm', quality: null };

  it('moves on to the next request after a pairable step, with its calls and step stored', () => {
    const { outcome } = settleAnswer(attempt(0, []), run, answer([call('t1', 'search'), call('t2', 'search')], ''), 5, 1, 0);
    expect(outcome).toMatchObject({ kind: 'turn', turn: { idx: 0, step: 0, content: null, toolCalls: [{ id: 't1' }, { id: 't2' }] } });
  });

  it('keeps a line up to its last complete turn, flagged, when a later step cannot be paired; fails it when none is complete', () => {
    const history = [
      record(0, { toolCalls: [call('t1', 'search'), call('t2', 'search')] }),
      record(1, { step: 1, toolCalls: [call('t3', 'fetch')] }),
      record(2, { step: 2, content: 'new 0' }),
    ];
    const { outcome } = settleAnswer(attempt(3, history), run, answer([call('t9', 'search')]), 5, 1, 0);
    if (outcome.kind !== 'completed') throw new Error(outcome.kind);
    expect(flagsFromBits(outcome.flags)).toEqual(['tool_mismatch']);
    expect(outcome.turn).toMatchObject({ idx: 3, flags: flagBit('tool_mismatch') });
    const line = JSON.parse(outcome.output);
    expect(line.content).toBe('new 0');
    expect(line.conversation.messages.at(-1)).toEqual({ role: 'assistant', content: 'new 0', reasoning_content: 'thought 2' });
    expect(line.conversation.turns).toHaveLength(3);
    expect(outcome.usage.completion_tokens).toBe(3 * usage.completion_tokens);

    const first = settleAnswer(attempt(0, []), run, answer([call('t1', 'fetch')]), 5, 1, 0).outcome;
    expect(first).toMatchObject({ kind: 'failed', error: { code: 'tool_mismatch', message: expect.stringMatching(/turn 0, step 0/) } });
    const strict = settleAnswer(attempt(3, history), { ...run, onToolMismatch: 'fail' }, answer([call('t9', 'search')]), 5, 1, 0).outcome;
    expect(strict).toMatchObject({ kind: 'failed', error: { code: 'tool_mismatch', message: expect.stringMatching(/turn 1, step 0/) } });
  });

  it("puts a plain answer's calls on its line", () => {
    const { outcome } = settleAnswer({ ...attempt(0, []), conversation: null }, run, answer([call('t1', 'search')]), 5, 1, 0);
    if (outcome.kind !== 'completed') throw new Error(outcome.kind);
    expect(JSON.parse(outcome.output).tool_calls).toEqual([call('t1', 'search')]);
  });

  it("sends the line's tools over the run's, on every request", () => {
    const request = JSON.stringify({ messages: stored, params: { tools: TOOLS } });
    const runTools = [{ type: 'function', function: { name: 'other' } }];
    expect(
      buildRequest(
        { model: 'm', params: { tools: runTools } },
        { request, qualityRetries: 0, turn: 1, history: [record(0, { toolCalls: [call('a', 'search'), call('b', 'search')] })] },
      ).body.tools,
    ).toEqual(TOOLS);
    expect(
      buildRequest({ model: 'm', params: { tools: runTools } }, { request: JSON.stringify({ messages: stored }), qualityRetries: 0, turn: 0 }).body.tools,
    ).toEqual(runTools);
  });
});

describe('streamed tool calls', () => {
  it("puts SGLang's fragments back together by index: id and name once, the arguments in pieces", () => {
    const s = new StreamedAnswer();
    const chunk = (delta: object, finish: string | null = null) =>
      JSON.stringify({ id: 'c', model: 'm', created: 1, choices: [{ index: 0, delta, finish_reason: finish }] });
    s.add(chunk({ role: 'assistant', content: '' }));
    s.add(chunk({ reasoning_content: 'think' }));
    s.add(chunk({ tool_calls: [{ index: 0, id: 'call_a', type: 'function', function: { name: 'search', arguments: '' } }] }));
    s.add(chunk({ tool_calls: [{ index: 0, function: { arguments: '{"q": ' } }] }));
    s.add(chunk({ tool_calls: [{ index: 1, id: 'call_b', type: 'function', function: { name: 'calc', arguments: '{}' } }] }));
    s.add(chunk({ tool_calls: [{ index: 0, function: { arguments: '"x"}' } }] }));
    const added = s.add(chunk({}, 'tool_calls'));
    expect(added).toEqual({ content: '', reasoning: '' });
    s.add(JSON.stringify({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 9 } }));
    const parsed = parseAnswer(s.response());
    if (!parsed.ok) throw new Error(parsed.error.message);
    expect(parsed.answer).toMatchObject({
      content: '',
      reasoning: 'think',
      finishReason: 'tool_calls',
      toolCalls: [call('call_a', 'search', '{"q": "x"}'), call('call_b', 'calc')],
    });
  });
});

describe('tool-call flags', () => {
  const base = { content: 'x', reasoning_content: null, finish_reason: 'stop', completion_tokens: 1, thinking_requested: false };
  const tools = new Set(['search']);
  const flags = (over: object) => flagsFromBits(computeFlags({ ...base, ...over }, { min_completion_tokens: 5 }));

  it('judges a step as a step, and flags calls in content, broken arguments and unknown tools', () => {
    // A step's null content and few tokens are what a step is.
    expect(flags({ content: null, tool_calls: [call('a', 'search')], tools })).toEqual([]);
    expect(flags({ content: null })).toEqual(['empty_content', 'too_short']);
    expect(flags({ content: '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>', completion_tokens: 9, tools })).toEqual(['tool_call_in_content']);
    expect(flags({ content: '{"name": "search", "arguments": {"q": 1}}', completion_tokens: 9, tools })).toEqual(['tool_call_in_content']);
    // Only where tools were offered.
    expect(flags({ content: '<tool_call>{}</tool_call>', completion_tokens: 9 })).toEqual([]);
    expect(flags({ content: null, tool_calls: [call('a', 'search', '[1]')], tools })).toEqual(['invalid_tool_arguments']);
    expect(flags({ content: null, tool_calls: [call('a', 'search', '{"q": ')], tools })).toEqual(['invalid_tool_arguments']);
    expect(flags({ content: null, tool_calls: [call('a', 'delete_all')], tools })).toEqual(['unknown_tool']);
    expect(callMarkupIn('The answer is {"name": "x"}.')).toBe(false);
  });

  it("names the tool-call parser for the model's family", () => {
    expect(toolCallParser('Qwen/Qwen3-Coder-480B-A35B-Instruct')).toBe('qwen3_coder');
    expect(toolCallParser('Qwen/Qwen3-8B')).toBe('qwen25');
    expect(toolCallParser('moonshotai/Kimi-K2-Instruct')).toBe('kimi_k2');
    expect(toolCallParser('zai-org/GLM-4.5')).toBe('glm45');
    expect(toolCallParser('openai/gpt-oss-120b')).toBe('gpt-oss');
    expect(toolCallParser('meta-llama/Llama-3.1-8B-Instruct')).toBe('llama3');
  });
});
