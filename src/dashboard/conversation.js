// @ts-check
// A sample's messages as the sample page shows them: the stored request, or for a conversation
// regenerated turn by turn the regenerated conversation, each reply with how its request went.
import { h } from './dom.js';
import { ms, num } from './format.js';

/** @typedef {import('../client/schema.js').components['schemas']} Schemas */

/** Message content is a string or a list of parts (text, images…); text is shown, the rest as JSON. */
/** @param {unknown} content */
export function contentText(content) {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((part) => (part && part.type === 'text' ? part.text : JSON.stringify(part))).join('\n');
  return content == null ? '' : JSON.stringify(content, null, 2);
}

/** One tool call as the page shows it: `id: name(arguments)`. */
function callText(/** @type {any} */ c) {
  return `${c?.id ?? '?'}: ${c?.function?.name ?? '?'}(${c?.function?.arguments ?? ''})`;
}

const flagList = (/** @type {string[]} */ flags) => flags.map((f) => h('code', { className: 'flag' }, f));

/**
 * One message: its role (a tool result names the call it answers), its text and its calls.
 * @param {any} m
 * @param {import('./dom.js').Child} [head] what the role line adds (a reply's request)
 */
function messageBox(m, head) {
  return h(
    'div',
    { className: `message role-${m.role}` },
    // Ids keep their case: the role line is shown in capitals, its request-head is not.
    h('div', { className: 'role' }, m.role, m.tool_call_id ? h('span', { className: 'request-head' }, ` → ${m.tool_call_id}`) : null, head ?? null),
    m.content == null && m.tool_calls ? null : h('pre', null, contentText(m.content)),
    // A step's calls, each with the id its tool result answers.
    Array.isArray(m.tool_calls) ? h('pre', { className: 'tool-calls' }, m.tool_calls.map(callText).join('\n')) : null,
  );
}

/**
 * What a reply's role line says of its request: the user turn (and step), finish reason, endpoint,
 * tokens, latency and flags.
 * @param {Schemas['SampleTurn']} t
 */
function requestHead(t) {
  const where = t.step > 0 || t.tool_calls ? `turn ${t.turn + 1}, step ${t.step + 1}` : `turn ${t.turn + 1}`;
  return h(
    'span',
    { className: 'request-head' },
    ` · ${where} · ${t.finish_reason ?? '—'} · ${t.endpoint_id ?? '—'} · ${num(t.usage.completion_tokens)} tokens · ${ms(t.latency_ms)}`,
    t.attempts > 1 ? ` · ${num(t.attempts)} attempts` : '',
    t.flags.length > 0 ? ' ' : '',
    flagList(t.flags),
  );
}

/**
 * A regenerated conversation in order: each reply shows its reasoning folded, its content as text
 * and its tool calls; the source's tool results follow the calls they answer.
 * @param {NonNullable<Schemas['SampleDetail']['conversation']>} conversation
 * @param {Schemas['SampleTurn'][]} turns
 */
export function conversationView(conversation, turns) {
  return h(
    'section',
    { className: 'messages conversation' },
    conversation.map((m) => {
      const t = m.request === undefined ? undefined : turns[m.request];
      if (m.role !== 'assistant' || !t) return messageBox(m);
      const reasoning = /** @type {string | null | undefined} */ (m.reasoning_content);
      return h(
        'div',
        { className: `reply${t.flags.length > 0 ? ' flagged' : ''}` },
        reasoning ? h('details', { className: 'message reasoning' }, h('summary', { className: 'role' }, 'reasoning'), h('pre', null, reasoning)) : null,
        messageBox(m.content == null && !m.tool_calls ? { ...m, content: '(empty)' } : m, requestHead(t)),
      );
    }),
  );
}

/**
 * A single request's sample: the messages sent, then the answer (reasoning and content).
 * @param {Schemas['SampleDetail']} s
 */
export function requestView(s) {
  return [
    h('h2', null, 'Messages'),
    h(
      'section',
      { className: 'messages' },
      s.messages.map((m) => messageBox(m)),
    ),
    h('h2', null, 'Output'),
    s.output
      ? h(
          'section',
          { className: 'messages' },
          h(
            'details',
            { className: 'message reasoning', open: true },
            h('summary', { className: 'role' }, 'reasoning'),
            h('pre', null, s.output.reasoning_content || '(empty)'),
          ),
          h('div', { className: 'message role-assistant' }, h('div', { className: 'role' }, 'content'), h('pre', null, s.output.content || '(empty)')),
        )
      : h('p', { className: 'muted' }, s.status === 'completed' ? 'The output is not available.' : 'No output yet.'),
  ];
}
