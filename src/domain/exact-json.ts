// JSON.parse makes every number a double: an id past 2^53 is renamed (9007199254740993 becomes
// 9007199254740992), -0 becomes 0, 1e21 is written back 1e+21, 1.0 as 1 and 1e400 as null. regen
// keeps a line's id and its own fields as the line wrote them: each as its source text, found by a
// scan that only the lines whose id or own fields hold numbers pay for.

/** JSON text kept as written, where parsing it and writing it back would change it. */
export class RawJson {
  constructor(readonly text: string) {}
}

/**
 * A number literal at the start of a value's text or after `:`, `,` or `[`, and before `,`, `}`,
 * `]` or its end: where JSON puts numbers. Inside a string the same characters match too, which
 * only costs the exact form.
 */
const NUMBER = /(?:^|[:,[])\s*(-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?)(?=\s*(?:[,}\]]|$))/g;

/** Whether a value's JSON text holds a number that JSON.parse would not write back as it was written. */
export function losesNumbers(text: string): boolean {
  NUMBER.lastIndex = 0;
  for (let m = NUMBER.exec(text); m !== null; m = NUMBER.exec(text)) {
    if (String(Number(m[1])) !== m[1]) return true;
  }
  return false;
}

/**
 * The shapes only a number that parsing changes has: 16 or more digits (past 2^53, or more
 * precision than a double holds), an exponent, -0, a fraction ending in 0, or below 10^-6 (written
 * back with an exponent). A number with none of them writes back as it was written.
 */
const LOSING_SHAPE = /(?:\d\.?){16}|\d[eE][+-]?\d|-0(?![.\d])|\.\d*0(?!\d)|\.0{6}/;

/** Whether a text may hold a number that parsing changes: a quick test that spares most lines the exact scan. */
export const mayLoseNumbers = (text: string): boolean => LOSING_SHAPE.test(text);

/** Whether a parsed value is or holds a number: only then can its text hold one that parsing changed. */
export function holdsNumber(value: unknown): boolean {
  if (typeof value === 'number') return true;
  if (typeof value !== 'object' || value === null) return false;
  for (const v of Array.isArray(value) ? value : Object.values(value)) if (holdsNumber(v)) return true;
  return false;
}

const WHITESPACE = new Set([' ', '\t', '\n', '\r']);
/** What a value of nested brackets or braces holds that the scan must see: its brackets, braces and strings. */
const STRUCTURE = /["[\]{}]/g;

function skipWhitespace(text: string, i: number): number {
  while (WHITESPACE.has(text[i])) i++;
  return i;
}

/** The index past the string starting at `i` (its opening quote). */
function stringEnd(text: string, i: number): number {
  for (let quote = text.indexOf('"', i + 1); ; quote = text.indexOf('"', quote + 1)) {
    let backslashes = 0;
    while (text[quote - 1 - backslashes] === '\\') backslashes++;
    if (backslashes % 2 === 0) return quote + 1;
  }
}

/** The index past the value starting at `i`. */
function valueEnd(text: string, i: number): number {
  const c = text[i];
  if (c === '"') return stringEnd(text, i);
  if (c === '{' || c === '[') {
    let depth = 0;
    STRUCTURE.lastIndex = i;
    for (let m = STRUCTURE.exec(text); m !== null; m = STRUCTURE.exec(text)) {
      if (m[0] === '"') STRUCTURE.lastIndex = stringEnd(text, m.index);
      else if (m[0] === '{' || m[0] === '[') depth++;
      else if (--depth === 0) return m.index + 1;
    }
    return text.length;
  }
  let j = i;
  while (j < text.length && !WHITESPACE.has(text[j]) && text[j] !== ',' && text[j] !== '}' && text[j] !== ']') j++;
  return j;
}

/**
 * The source text of each member of the JSON object `text` (valid JSON: JSON.parse took it), by
 * key; a key given twice keeps its last value, as JSON.parse does.
 */
export function objectMembers(text: string): Map<string, string> {
  const members = new Map<string, string>();
  let i = skipWhitespace(text, text.indexOf('{') + 1);
  while (text[i] === '"') {
    const keyEnd = stringEnd(text, i);
    const key = JSON.parse(text.slice(i, keyEnd)) as string;
    const start = skipWhitespace(text, skipWhitespace(text, keyEnd) + 1);
    const end = valueEnd(text, start);
    members.set(key, text.slice(start, end));
    i = skipWhitespace(text, end);
    if (text[i] === ',') i = skipWhitespace(text, i + 1);
  }
  return members;
}

/** An object written from its members' JSON text. */
export function objectText(members: Record<string, string>): string {
  return `{${Object.entries(members)
    .map(([key, text]) => `${JSON.stringify(key)}:${text}`)
    .join(',')}}`;
}

const isPlainObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof RawJson);

/** Whether an object holds a RawJson among its values, or in an object among them. */
function holdsRaw(value: Record<string, unknown>): boolean {
  for (const v of Object.values(value)) if (v instanceof RawJson || (isPlainObject(v) && holdsRaw(v))) return true;
  return false;
}

/** JSON.stringify, but a RawJson among an object's values (at any depth of objects) is written as its text. */
export function stringifyExact(value: unknown): string {
  if (value instanceof RawJson) return value.text;
  if (!isPlainObject(value) || !holdsRaw(value)) return JSON.stringify(value);
  const members: string[] = [];
  for (const [key, v] of Object.entries(value)) {
    if (v !== undefined) members.push(`${JSON.stringify(key)}:${stringifyExact(v)}`);
  }
  return `{${members.join(',')}}`;
}
