// Strings JavaScript and JSON.parse accept but other readers refuse: PostgreSQL's jsonb and text
// (NUL, and an unpaired surrogate escape), jq and most JSON libraries outside JavaScript (an
// unpaired surrogate), UTF-8 itself (a lone surrogate has no encoding: it is stored as U+FFFD, so
// two ids would become one). Anything regen stores or sends on is checked with these.

// Read code unit by code unit (no `u` flag): a high surrogate not followed by a low one, or a low one
// not preceded by a high one.
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

const LONE_SURROGATES = new RegExp(LONE_SURROGATE.source, 'g');

/**
 * `s` with each unpaired surrogate replaced by U+FFFD, what a UTF-8 encoder writes for one, so that
 * every output format holds the same string; `s` itself when it has none.
 */
export function wellFormedText(s: string): string {
  return LONE_SURROGATE.test(s) ? s.replace(LONE_SURROGATES, '\uFFFD') : s;
}

/** Why a string cannot be stored as text, or null when it can. */
export function textProblem(s: string): string | null {
  if (s.includes('\u0000')) return 'must not contain the NUL character (\\u0000)';
  if (LONE_SURROGATE.test(s)) return 'must not contain an unpaired surrogate (\\ud800 to \\udfff alone): it is not Unicode text';
  return null;
}

/**
 * Escapes in a JSON text that could decode to such a string: NUL and the surrogates. Raw UTF-8
 * cannot hold either (a raw NUL inside a JSON string is invalid JSON), so text without these
 * escapes need not be walked.
 */
const SUSPECT_ESCAPE = /\\u(?:0000|[dD][89a-fA-F])/;

export function mayHoldBadText(json: string): boolean {
  return SUSPECT_ESCAPE.test(json);
}

/** The first string in a parsed JSON value, key or value, that cannot be stored: its path and why. */
export function findBadText(value: unknown, path: (string | number)[] = []): { path: (string | number)[]; message: string } | null {
  if (typeof value === 'string') {
    const message = textProblem(value);
    return message ? { path, message } : null;
  }
  if (Array.isArray(value)) {
    for (const [i, item] of value.entries()) {
      const found = findBadText(item, [...path, i]);
      if (found) return found;
    }
    return null;
  }
  if (typeof value === 'object' && value !== null) {
    for (const [key, item] of Object.entries(value)) {
      const keyProblem = textProblem(key);
      if (keyProblem) return { path, message: `a key ${keyProblem}` };
      const found = findBadText(item, [...path, key]);
      if (found) return found;
    }
  }
  return null;
}

/** A path into a JSON value as users name a field: `params.temperature`, `input.requests[3]`. */
export function fieldPath(path: readonly PropertyKey[]): string {
  return path.reduce<string>((acc, p) => (typeof p === 'number' ? `${acc}[${p}]` : acc ? `${acc}.${String(p)}` : String(p)), '');
}
