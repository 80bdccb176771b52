import { describe, expect, it } from 'vitest';
import { regeneratedMessages, type TurnRecord, turnCount, turnMessages } from '../../src/domain/conversation.js';
import { flagBit } from '../../src/domain/flags.js';
import { aheadShare, computeForecast, POSITION_PRIOR_TURNS, positionShares } from '../../src/domain/forecast.js';
import { errorLine, outputLine } from '../../src/domain/output-line.js';
import { parseInputLine } from '../../src/domain/input-line.js';
import { type Attempt, settleAnswer, settleError } from '../../src/runner/outcomes.js';
import { joinIds, type StagedIds, stagedOutput, stagedPrompt } from '../../src/domain/token-rows.js';
import { buildRequest, type Answer } from '../../src/runner/request.js';

// `regenerate: "all_assistant"`: which lines can be walked turn by turn, what each turn is asked
// with, and what an answered turn makes of its conversation.

const parse = (line: unknown) => parseInputLine(JSON.stringify(line), 1, { regenerate: 'all_assistant' });

describe('parseInputLine with all_assistant', () => {
  const system = { role: 'system', content: 'Be brief.' };
  const u = (n: number) => ({ role: 'user', content: `q${n}` });
  const a = (n: number) => ({ role: 'assistant', content: `old ${n}`, reasoning_content: 'old thoughts' });

  it('drops every assistant turn and counts the user turns, in each shape that carries a conversation', () => {
    const walked = [system, u(0), u(1)];
    const shapes = [
      { custom_id: 'm', messages: [system, u(0), a(0), u(1), a(1)] },
      {
        custom_id: 's',
        conversations: [
          { from: 'system', value: 'Be brief.' },
          { from: 'human', value: 'q0' },
          { from: 'gpt', value: 'old 0' },
          { from: 'human', value: 'q1' },
          { from: 'gpt', value: 'old 1' },
        ],
      },
      { custom_id: 'c', conversations: [system, u(0), { role: 'assistant', content: 'old 0' }, u(1), { role: 'assistant', content: 'old 1' }] },
    ];
    for (const line of shapes) {
      const parsed = parse(line);
      expect(parsed, line.custom_id).toMatchObject({ ok: true, messages: walked, turns: 2 });
    }
    // The old answers (reasoning included) predict the new ones' length.
    expect(parse(shapes[0])).toMatchObject({ old_answer_chars: 2 * ('old 0'.length + 'old thoughts'.length) });
  });

  it('answers a conversation that ends on a user turn, and one with no old answers at all', () => {
    expect(parse({ messages: [u(0), a(0), u(1)] })).toMatchObject({ ok: true, messages: [u(0), u(1)], turns: 2 });
    expect(parse({ messages: [u(0)] })).toMatchObject({ ok: true, messages: [u(0)], turns: 1, old_answer_chars: null });
  });

  it('refuses, with a code of its own, the lines it cannot walk', () => {
    const refused = [
      { messages: [u(0), { role: 'tool', content: '1', tool_call_id: 't' }], why: /is a tool result/ },
      { messages: [a(0), u(0)], why: /comes before any user turn/ },
      { messages: [system, a(0), u(0)], why: /comes before any user turn/ },
      { messages: [u(0), { role: 'assistant', content: '', function_call: { name: 'f', arguments: '{}' } }], why: /deprecated function_call/ },
      { messages: [system], why: /no user turn/ },
    ];
    for (const { messages, why } of refused) {
      const parsed = parse({ custom_id: 'x', messages });
      expect(parsed.ok).toBe(false);
      if (parsed.ok) continue;
      expect(parsed.code).toBe('unwalkable_conversation');
      expect(parsed.reason).toMatch(why);
      expect(parsed.custom_id).toBe('x');
    }
    // A tool result in ShareGPT's shape too.
    expect(
      parse({
        conversations: [
          { from: 'human', value: 'q' },
          { from: 'observation', value: '{}' },
        ],
      }),
    ).toMatchObject({
      ok: false,
      code: 'unwalkable_conversation',
    });
    // An unknown role is refused as any line's would be.
    expect(parse({ messages: [{ role: 'bot', content: 'q' }] })).toMatchObject({ ok: false, code: 'invalid_role' });
    expect(parse({ conversations: [{ role: 'human', content: 'q' }] })).toMatchObject({ ok: false, code: 'invalid_role' });
  });

  it('leaves last_assistant as it was', () => {
    const parsed = parseInputLine(JSON.stringify({ messages: [u(0), a(0), u(1), a(1)] }), 1, { regenerate: 'last_assistant' });
    expect(parsed).toMatchObject({ ok: true, messages: [u(0), a(0), u(1)] });
    expect(parsed).not.toHaveProperty('turns');
  });
});

describe('turn messages', () => {
  const messages = [
    { role: 'system', content: 's' },
    { role: 'user', content: 'q0' },
    { role: 'user', content: 'q1' },
    { role: 'user', content: 'q2' },
  ];
  const replies = [
    { ...turn(0, 'r0', 0), reasoningContent: 't0' },
    { ...turn(1, 'r1', 0), reasoningContent: 't1' },
    { ...turn(2, 'r2', 0), reasoningContent: null },
  ];

  it('asks each turn with the replies regenerated before it, their content only', () => {
    expect(turnCount(messages)).toBe(3);
    expect(turnMessages(messages, [])).toEqual(messages.slice(0, 2));
    expect(turnMessages(messages, replies.slice(0, 2))).toEqual([
      { role: 'system', content: 's' },
      { role: 'user', content: 'q0' },
      { role: 'assistant', content: 'r0' },
      { role: 'user', content: 'q1' },
      { role: 'assistant', content: 'r1' },
      { role: 'user', content: 'q2' },
    ]);
  });

  it('writes the regenerated conversation with each reply after its user turn, reasoning included', () => {
    expect(regeneratedMessages(messages, replies)).toEqual([
      { role: 'system', content: 's' },
      { role: 'user', content: 'q0' },
      { role: 'assistant', content: 'r0', reasoning_content: 't0' },
      { role: 'user', content: 'q1' },
      { role: 'assistant', content: 'r1', reasoning_content: 't1' },
      { role: 'user', content: 'q2' },
      { role: 'assistant', content: 'r2', reasoning_content: null },
    ]);
  });

  it('builds the request body of a turn from the stored conversation and its history', () => {
    const request = JSON.stringify({ messages: messages.slice(0, 3) });
    const history: TurnRecord[] = [turn(0, 'r0', 0)];
    const { body } = buildRequest({ model: 'm', params: {} }, { request, qualityRetries: 0, turn: 1, history });
    expect(body.messages).toEqual([...messages.slice(0, 2), { role: 'assistant', content: 'r0' }, messages[2]]);
    // A single request is sent as stored.
    expect(buildRequest({ model: 'm', params: {} }, { request, qualityRetries: 0, turn: null }).body.messages).toEqual(messages.slice(0, 3));
  });
});

function turn(idx: number, content: string, flags: number): TurnRecord {
  return {
    idx,
    step: 0,
    content,
    reasoningContent: `thought ${idx}`,
    toolCalls: null,
    finishReason: 'stop',
    usage: { prompt_tokens: 10 * (idx + 1), completion_tokens: 5, reasoning_tokens: 2, cached_tokens: idx },
    endpointId: 'e1',
    latencyMs: 100,
    attempts: 1,
    flags,
  };
}

describe('an answered turn', () => {
  const messages = [
    { role: 'user', content: 'q0' },
    { role: 'user', content: 'q1' },
  ];
  const attempt = (turnIdx: number, history: TurnRecord[], extra: Partial<Attempt> = {}): Attempt => ({
    sampleId: 1,
    runId: 'r',
    shardIdx: 0,
    endpointId: 'e2',
    attempts: 2,
    qualityRetries: 0,
    serverFaults: 1,
    thinking: true,
    cancelled: false,
    quarantined: false,
    variant: null,
    maxTokens: null,
    contextLength: null,
    conversation: { turn: turnIdx, messages, history },
    ...extra,
  });
  const answer: Answer = {
    content: 'new',
    reasoning: 'thinking',
    toolCalls: null,
    finishReason: 'stop',
    usage: { prompt_tokens: 30, completion_tokens: 7, reasoning_tokens: 3, cached_tokens: 20 },
    model: 'm',
    responseId: 'id',
    created: 1,
    logprobs: null,
  };
  const run = { model: 'm', quality: null };

  it('moves a conversation with turns left on to its next turn, carrying the turn and the flags so far', () => {
    const { outcome } = settleAnswer(attempt(0, []), run, answer, 50, 1000, flagBit('too_short'));
    expect(outcome).toMatchObject({
      kind: 'turn',
      flags: flagBit('too_short'),
      turn: { idx: 0, content: 'new', reasoningContent: 'thinking', endpointId: 'e2', latencyMs: 50, attempts: 3, usage: answer.usage },
    });
  });

  it("completes the conversation on its last turn: every turn's usage added up, the flags of any turn", () => {
    const { outcome } = settleAnswer(attempt(1, [turn(0, 'r0', flagBit('truncated'))]), run, answer, 50, 1000, 0);
    if (outcome.kind !== 'completed') throw new Error(`expected completed, got ${outcome.kind}`);
    expect(outcome.flags).toBe(flagBit('truncated'));
    expect(outcome.turn).toMatchObject({ idx: 1, content: 'new' });
    const staged = JSON.parse(outcome.output);
    expect(staged.content).toBe('new');
    expect(staged.conversation.messages).toEqual([
      messages[0],
      { role: 'assistant', content: 'r0', reasoning_content: 'thought 0' },
      messages[1],
      { role: 'assistant', content: 'new', reasoning_content: 'thinking' },
    ]);
    expect(staged.conversation.usage).toEqual({ prompt_tokens: 40, completion_tokens: 12, reasoning_tokens: 5, cached_tokens: 20 });
    expect(staged.conversation.turns.map((t: { flags: string[] }) => t.flags)).toEqual([['truncated'], []]);
    expect(staged.conversation.attempts).toBe(4);
  });

  it("keeps a request's token ids packed with its turn, and stages every turn's with the conversation", () => {
    const withIds = (ids: { prompt: number[]; output: number[] }): Answer => ({ ...answer, ids });
    const first = settleAnswer(attempt(0, []), run, withIds({ prompt: [1, 2], output: [3] }), 50, 1000, 0).outcome;
    if (first.kind !== 'turn') throw new Error(`expected turn, got ${first.kind}`);
    // As sample_turns.token_ids stores it: packed, under names an older replica does not read as ids.
    expect(Object.keys(first.turn.ids ?? {}).sort()).toEqual(['output_packed', 'prompt_packed']);
    const last = settleAnswer(
      attempt(1, [{ ...turn(0, 'r0', 0), ids: first.turn.ids }]),
      run,
      withIds({ prompt: [1, 2, 3, 4], output: [5, 6] }),
      50,
      1000,
      0,
    ).outcome;
    if (last.kind !== 'completed') throw new Error(`expected completed, got ${last.kind}`);
    const staged = JSON.parse(last.output) as { tokens: StagedIds[] };
    expect(staged.tokens.map((g) => [g.turn, [...joinIds(stagedPrompt(g))], [...joinIds(stagedOutput(g))]])).toEqual([
      [0, [1, 2], [3]],
      [1, [1, 2, 3, 4], [5, 6]],
    ]);
  });

  it('fails its conversation naming the turn, when the turn fails for good', () => {
    const error = { code: 'invalid_request' as const, message: 'too long', status: 400 };
    const { outcome } = settleError(attempt(1, [turn(0, 'r0', 0)]), { maxAttempts: 3, maxServerFaults: 3, retryMs: 500 }, error, 1000);
    expect(outcome).toMatchObject({ kind: 'failed', turn: 1 });
  });

  const cut: Answer = { ...answer, finishReason: 'length', usage: { ...answer.usage, prompt_tokens: 100 } };

  it('asks a turn cut by max_tokens again with max_tokens doubled under on_length "retry", the turn not moved on', () => {
    const settled = settleAnswer(attempt(1, [turn(0, 'r0', 0)], { maxTokens: 256, contextLength: 4096 }), { ...run, onLength: 'retry' }, cut, 50, 1000, 0);
    expect(settled).toMatchObject({ retried: 'length', outcome: { kind: 'retry', maxTokens: 512, qualityRetry: false, serverFault: false } });
  });

  it('fails the conversation naming the cut turn under on_length "fail", and when "retry" has no room left', () => {
    const failed = settleAnswer(attempt(1, [turn(0, 'r0', 0)], { maxTokens: 256 }), { ...run, onLength: 'fail' }, cut, 50, 1000, 0).outcome;
    expect(failed).toMatchObject({
      kind: 'failed',
      turn: 1,
      error: { code: 'truncated', message: expect.stringMatching(/^turn 1's answer was cut at max_tokens 256/) },
    });
    const full = { maxTokens: 3995, contextLength: 4096 };
    const exhausted = settleAnswer(attempt(0, [], full), { ...run, onLength: 'retry' }, cut, 50, 1000, 0).outcome;
    expect(exhausted).toMatchObject({ kind: 'failed', turn: 0, error: { code: 'length_exhausted', message: expect.stringContaining("turn 0's answer") } });
    // A single request's failure names no turn.
    const single = settleAnswer(attempt(0, [], { conversation: null, maxTokens: 256 }), { ...run, onLength: 'fail' }, cut, 50, 1000, 0).outcome;
    expect(single).not.toHaveProperty('turn');
  });
});

describe('the forecast of a conversation run', () => {
  const input = {
    whole: false,
    total: 100,
    remaining: 50,
    completionTokens: 5000,
    slice: [] as [number, number][],
    sliceOpen: 0,
    frontier: -1,
    tokensPerSecond: 1000,
    endpoints: 1,
    elapsedSeconds: 10,
    deadlineSeconds: null,
    now: 0,
  };

  it('takes no less than its longest chain of turns, however fast the fleet', () => {
    // 50 conversations left of 100 tokens each: 5 s at the fleet's rate.
    expect(computeForecast(input, () => 0.5)?.wall_seconds_remaining).toBe(5);
    expect(computeForecast({ ...input, chainSeconds: 12 }, () => 0.5)).toMatchObject({ wall_seconds_remaining: 12, low: 12, high: 12 });
    expect(computeForecast({ ...input, chainSeconds: 2 }, () => 0.5)?.wall_seconds_remaining).toBe(5);
  });

  it('weighs the turns ahead by their position in their conversations', () => {
    // First turns answered at 10 tokens, second turns at 30 (100 of each): the mean of all is 20.
    const lengths = [
      { n: 100, tokens: 1000 },
      { n: 100, tokens: 3000 },
    ];
    const shares = positionShares(lengths);
    expect(shares[0]).toBeCloseTo((1000 + POSITION_PRIOR_TURNS * 20) / (100 + POSITION_PRIOR_TURNS) / 20);
    expect(shares[1]).toBeCloseTo((3000 + POSITION_PRIOR_TURNS * 20) / (100 + POSITION_PRIOR_TURNS) / 20);
    // 100 turns left, all second turns: 100 × 20 × shares[1] tokens at 1000 a second.
    const turns = { left: 100, answered: 200, tokens: 4000, positions: { lengths, ahead: [0, 100] } };
    expect(computeForecast({ ...input, turns }, () => 0.5)?.completion_tokens_remaining).toBe(Math.round(100 * 20 * shares[1]));
    // Half first, half second turns: the mean of all again.
    const even = { ...turns, positions: { lengths, ahead: [50, 50] } };
    expect(computeForecast({ ...input, turns: even }, () => 0.5)?.completion_tokens_remaining).toBe(2000);
    // A position no answer has reached yet takes the mean of all.
    expect(aheadShare({ lengths, ahead: [0, 0, 10] })).toBe(1);
    expect(aheadShare(undefined)).toBe(1);
  });

  it('counts what is left in turns, so it moves as conversations under way answer theirs', () => {
    // 250 turns answered at 20 tokens each; the 50 conversations left still have 100 turns to ask: 2 s.
    const turns = { left: 100, answered: 250, tokens: 5000 };
    expect(computeForecast({ ...input, turns }, () => 0.5)).toMatchObject({ wall_seconds_remaining: 2, based_on_samples: 250 });
    // The same conversations a few turns on: the forecast falls, though no conversation ended.
    expect(computeForecast({ ...input, turns: { left: 40, answered: 310, tokens: 6200 } }, () => 0.5)?.wall_seconds_remaining).toBe(0.8);
    // A small run whose slice is its whole input: answered turns are a basis before any conversation ends.
    const small = { ...input, total: 20, remaining: 20, completionTokens: 600, sliceOpen: 20, turns: { left: 50, answered: 30, tokens: 600 } };
    expect(computeForecast(small, () => 0.5)?.wall_seconds_remaining).toBe(1);
    expect(computeForecast({ ...small, turns: { left: 75, answered: 5, tokens: 100 } }, () => 0.5)).toBeNull();
  });
});

describe("a conversation's lines", () => {
  const sample = {
    customId: 'c',
    sampleIndex: 0,
    request: JSON.stringify({ messages: [{ role: 'user', content: 'q0' }] }),
    finishReason: 'stop',
    promptTokens: 1,
    completionTokens: 2,
    reasoningTokens: 0,
    cachedTokens: 0,
    endpointId: 'e1',
    latencyMs: 5,
    attempts: 1,
    serverFaults: 0,
    flags: 0,
  };

  it('writes the regenerated conversation and its turns, the totals at the top', () => {
    const usage = { prompt_tokens: 9, completion_tokens: 8, reasoning_tokens: 7, cached_tokens: 6 };
    const turns = [{ turn: 0, step: 0, finish_reason: 'stop', usage, endpoint_id: 'e1', latency_ms: 5, attempts: 1, flags: [] }];
    const messages = [
      { role: 'user', content: 'q0' },
      { role: 'assistant', content: 'a', reasoning_content: 'r' },
    ];
    const line = JSON.parse(
      outputLine(sample, { content: 'a', reasoning_content: 'r', model: 'm', conversation: { messages, turns, usage, latency_ms: 50, attempts: 3 } }),
    );
    expect(line).toMatchObject({ messages, turns, usage, latency_ms: 50, attempts: 3, content: 'a' });
    // A single request's line has no turns.
    expect(JSON.parse(outputLine(sample, { content: 'a', reasoning_content: 'r', model: 'm' }))).not.toHaveProperty('turns');
  });

  it("names the failed turn on a conversation's error line only", () => {
    const failed = { customId: 'c', sampleIndex: 0, errorCode: 'server_error', errorMessage: 'x', errorStatus: 500, attempts: 3, serverFaults: 0 };
    expect(JSON.parse(errorLine({ ...failed, turn: 2 })).turn).toBe(2);
    expect(JSON.parse(errorLine({ ...failed, turn: null }))).not.toHaveProperty('turn');
  });
});
