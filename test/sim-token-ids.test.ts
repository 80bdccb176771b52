import { afterEach, describe, expect, it } from 'vitest';
import { startSimulator, type Simulator } from '../src/sim/server.js';
import { answerIds, promptIds } from '../src/sim/token-ids.js';

const IM_END = 151645;
const messages = [
  { role: 'system', content: 'Be brief.' },
  { role: 'user', content: 'What is two plus two, in words? [len=12]' },
];

const opened: Simulator[] = [];
afterEach(async () => {
  await Promise.all(opened.splice(0).map((sim) => sim.close()));
});

async function start(options: Parameters<typeof startSimulator>[0] = {}): Promise<Simulator> {
  const sim = await startSimulator(options);
  opened.push(sim);
  return sim;
}

const post = (sim: Simulator, body: object) => fetch(`${sim.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify(body) });

/** The events of a streamed reply, [DONE] left out. */
async function events(response: Response): Promise<any[]> {
  const text = await response.text();
  return text
    .split('\n\n')
    .filter((e) => e.startsWith('data: ') && e !== 'data: [DONE]')
    .map((e) => JSON.parse(e.slice(6)));
}

describe('simulator: token ids as SGLang returns them', () => {
  it('return_token_ids: per-choice prompt and generated ids whose counts are the usage', async () => {
    const sim = await start();
    const reply = await (await post(sim, { messages, n: 2, return_token_ids: true })).json();
    expect(reply.usage.prompt_tokens).toBe(promptIds(messages).length);
    let generated = 0;
    for (const choice of reply.choices) {
      expect(choice.prompt_token_ids).toEqual(promptIds(messages));
      const text = `${choice.message.reasoning_content ?? ''}${choice.message.content}`;
      expect(choice.token_ids).toEqual(answerIds(text, choice.token_ids.length, true));
      expect(choice.token_ids.at(-1)).toBe(IM_END);
      generated += choice.token_ids.length;
    }
    expect(generated).toBe(reply.usage.completion_tokens);
    expect(reply.sglext).toBeUndefined();
  });

  it('an answer cut by max_tokens has no end token', async () => {
    const sim = await start();
    const reply = await (await post(sim, { messages, max_tokens: 5, return_token_ids: true })).json();
    expect(reply.choices[0].finish_reason).toBe('length');
    expect(reply.choices[0].token_ids).toHaveLength(5);
    expect(reply.choices[0].token_ids).not.toContain(IM_END);
  });

  it('refuses return_token_ids and return_prompt_token_ids on a stream with a 400', async () => {
    const sim = await start();
    for (const param of ['return_token_ids', 'return_prompt_token_ids']) {
      const response = await post(sim, { messages, stream: true, [param]: true });
      expect(response.status).toBe(400);
      expect((await response.json()).message).toContain(`${param} is not supported with streaming`);
    }
    expect(sim.stats().completed).toBe(0);
  });

  it('return_prompt_token_ids gives the prompt ids only', async () => {
    const sim = await start();
    const reply = await (await post(sim, { messages, return_prompt_token_ids: true })).json();
    expect(reply.choices[0].prompt_token_ids).toEqual(promptIds(messages));
    expect(reply.choices[0].token_ids).toBeUndefined();
  });

  it('return_input_ids / return_output_ids: sglext on the body, and in a last event of a stream', async () => {
    const sim = await start();
    const body = { messages, n: 2, return_input_ids: true, return_output_ids_in_sglext: true };
    const reply = await (await post(sim, body)).json();
    expect(reply.sglext.input_ids).toEqual(promptIds(messages));
    expect(reply.sglext.output_ids).toHaveLength(2);
    expect(reply.sglext.output_ids.flat()).toHaveLength(reply.usage.completion_tokens);
    expect(reply.choices[0].token_ids).toBeUndefined();

    const streamed = await events(await post(sim, { ...body, stream: true, stream_options: { include_usage: true } }));
    const last = streamed.at(-1);
    expect(last.choices).toEqual([]);
    expect(last.sglext).toEqual(reply.sglext);
    expect(streamed.filter((e) => e.sglext)).toHaveLength(1);
  });

  it('an older server ignores the parameters it does not know', async () => {
    const sim = await start({ tokenIdApi: 'token_ids' });
    const reply = await (await post(sim, { messages, return_input_ids: true, return_output_ids: true })).json();
    expect(reply.sglext).toBeUndefined();
    sim.configure({ tokenIdApi: 'none' });
    const old = await (await post(sim, { messages, stream: true, return_token_ids: true })).text();
    expect(old).toContain('data: [DONE]');
  });

  it("vLLM's return_token_ids: prompt ids at the top level, and on a stream the first event's prompt ids and each event's generated ids", async () => {
    const sim = await start({ tokenIdApi: 'vllm' });
    const reply = await (await post(sim, { messages, n: 2, return_token_ids: true })).json();
    expect(reply.prompt_token_ids).toEqual(promptIds(messages));
    expect(reply.choices.every((c: any) => c.prompt_token_ids === undefined)).toBe(true);
    expect(reply.choices[0].token_ids.length + reply.choices[1].token_ids.length).toBe(reply.usage.completion_tokens);
    // vLLM has no return_prompt_token_ids nor sglext ids.
    const other = await (await post(sim, { messages, return_prompt_token_ids: true, return_input_ids: true })).json();
    expect(other.prompt_token_ids).toBeUndefined();
    expect(other.sglext).toBeUndefined();

    const body = { messages, stream: true, stream_options: { include_usage: true }, return_token_ids: true };
    const unstreamed = await (await post(sim, { ...body, stream: false })).json();
    const streamed = await events(await post(sim, body));
    expect(streamed[0].prompt_token_ids).toEqual(promptIds(messages));
    expect(streamed.slice(1).every((e) => e.prompt_token_ids === undefined)).toBe(true);
    // Several events carry ids, and put together in order they are the choice's, as unstreamed.
    const carrying = streamed.filter((e) => e.choices[0]?.token_ids);
    expect(carrying.length).toBeGreaterThan(1);
    const ids = carrying.flatMap((e) => e.choices[0].token_ids);
    expect(ids).toEqual(unstreamed.choices[0].token_ids);
    expect(ids.at(-1)).toBe(IM_END);
    expect(ids).toHaveLength(streamed.at(-1).usage.completion_tokens);
  });

  it('tokenIdMismatchRate makes ids disagree with usage', async () => {
    const sim = await start({ tokenIdMismatchRate: 1 });
    const reply = await (await post(sim, { messages, return_token_ids: true })).json();
    expect(reply.choices[0].token_ids.length).toBe(reply.usage.completion_tokens - 1);
  });
});
