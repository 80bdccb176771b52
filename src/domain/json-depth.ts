/**
 * How deep user-supplied JSON (params passed through to SGLang, message content, inline requests)
 * may nest. JSON.parse takes a million levels, but JSON.stringify and every recursive reader after
 * it overflow the stack at a few thousand, so depth is refused where the value comes in.
 * Real payloads (content parts, JSON schemas in params) stay far below this.
 */
export const MAX_JSON_DEPTH = 100;

export const tooDeepMessage = `must not nest more than ${MAX_JSON_DEPTH} levels deep`;

/** True when arrays and objects in `value` nest deeper than `max`; iterative, so any depth is safe to check. */
export function nestsDeeperThan(value: unknown, max = MAX_JSON_DEPTH): boolean {
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length) {
    const [v, depth] = stack.pop()!;
    if (v === null || typeof v !== 'object') continue;
    if (depth + 1 > max) return true;
    for (const child of Array.isArray(v) ? v : Object.values(v)) if (child !== null && typeof child === 'object') stack.push([child, depth + 1]);
  }
  return false;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_ARRAY = 0x5b;
const OPEN_OBJECT = 0x7b;
const CLOSE_ARRAY = 0x5d;
const CLOSE_OBJECT = 0x7d;

/**
 * True when the arrays and objects of a JSON text nest deeper than `max`, read before the text is
 * parsed: JSON.parse itself takes any depth, but slowly (100,000 levels take it 0.3 s, ten million
 * half a minute), and what is done with the value after it overflows the stack. Strings are jumped
 * over whole (indexOf), so a text that is mostly strings, as an answer is, costs little more than
 * finding its quotes. Meant for text that is then parsed: a text that is not JSON may say either.
 */
export function jsonTextNestsDeeperThan(text: string, max = MAX_JSON_DEPTH): boolean {
  // JSON deeper than `max` opens and closes more than `max` brackets: a shorter text, a streamed
  // event say, is either shallower or not JSON at all.
  if (text.length < 2 * (max + 1)) return false;
  let depth = 0;
  const n = text.length;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) {
      // The closing quote is the next one not escaped: preceded by an even run of backslashes.
      for (;;) {
        const close = text.indexOf('"', i + 1);
        if (close < 0) return false;
        let slashes = 0;
        while (text.charCodeAt(close - 1 - slashes) === BACKSLASH) slashes++;
        i = close;
        if (slashes % 2 === 0) break;
      }
    } else if (c === OPEN_ARRAY || c === OPEN_OBJECT) {
      if (++depth > max) return true;
    } else if (c === CLOSE_ARRAY || c === CLOSE_OBJECT) {
      depth--;
    }
  }
  return false;
}
