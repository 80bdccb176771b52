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
