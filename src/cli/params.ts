import { UsageError } from './client.js';

const KEY = /^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*$/;

/**
 * `--param temperature=0.6 --param chat_template_kwargs.enable_thinking=true` → nested params.
 * A value that reads as JSON (numbers, true/false, null, arrays, objects, "quoted") is taken as
 * JSON; anything else is a string.
 */
export function parseParams(pairs: string[]): Record<string, unknown> {
  const params: Record<string, unknown> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf('=');
    const key = eq < 0 ? '' : pair.slice(0, eq).trim();
    if (!KEY.test(key)) throw new UsageError(`--param: expected key=value or a.b=value (got ${JSON.stringify(pair)})`);
    const raw = pair.slice(eq + 1);
    let value: unknown;
    try {
      value = JSON.parse(raw);
    } catch {
      value = raw;
    }
    const path = key.split('.');
    let at = params;
    for (const part of path.slice(0, -1)) {
      const next = at[part] ?? {};
      if (typeof next !== 'object' || next === null || Array.isArray(next)) throw new UsageError(`--param: ${key} conflicts with an earlier value of ${part}`);
      at = at[part] = next as Record<string, unknown>;
    }
    const last = path[path.length - 1];
    if (last in at && typeof at[last] === 'object' && at[last] !== null)
      throw new UsageError(`--param: ${key} would replace the ${key}.* values given earlier`);
    at[last] = value;
  }
  return params;
}
