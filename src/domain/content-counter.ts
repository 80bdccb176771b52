import { WHITESPACE_TO_COLLAPSE } from './quality.js';
import { Ring } from './ring.js';

// duplicate_content: how many of the run's recent answers are the same text. A broken model or
// template answers "OK." to everything; a healthy run, even one of short answers ("42", "Paris"),
// spreads over many texts, the commonest rarely above 1-2% of them.

/**
 * Answers the count looks back over. A window, not the whole run: a share of the whole run lets
 * a flood that starts after 100,000 healthy answers pass unflagged for 5,000 more, while over
 * 1024 answers it is flagged within about 60. The count is exact, in memory bounded by the window
 * (1024 hashes and at most 1024 entries of ≤ 40 characters), so no estimation error to bound.
 */
export const CONTENT_WINDOW = 1024;
/**
 * A text is a duplicate once it holds this share of the window. 5% of 1024 is 52 copies: a
 * healthy text answered 2% of the time (about 20 in 1024, σ 4.5) is 7σ away, one at 3% still
 * 3.8σ; "OK." at 87% gets there within 60 answers.
 */
export const DUPLICATE_SHARE = 0.05;
/**
 * Copies needed however few answers are in: the 10th "OK." of a run that starts broken is
 * flagged (about its 12th answer), while a text answered 1% of the time has 4.6e-5 odds of 10
 * copies among a run's first 200 answers.
 */
export const DUPLICATE_MIN_COUNT = 10;
/** Characters of a text kept to show it in a verdict. */
export const CONTENT_SAMPLE_CHARS = 40;
// Longer texts are known by their head, their tail and their length: hashing 50 KB a sample would
// cost more than the rest of the checks, and two long answers alike in all three are the same.
const LONG_TEXT_CHARS = 2048;
const HEAD_TAIL_CHARS = 1024;

/**
 * The text as compared: trimmed, whitespace runs as one space, lower-case, without trailing
 * sentence punctuation, so "OK.", "ok" and " Ok! " are one answer.
 */
export function normaliseContent(content: string): string {
  return content
    .trim()
    .replace(WHITESPACE_TO_COLLAPSE, ' ')
    .toLowerCase()
    .replace(/[.!?。]+$/, '');
}

/** The hash a text is counted under, or null for a blank one (already empty_content). */
export function contentKey(content: string | null): number | null {
  if (content === null) return null;
  const key =
    content.length > LONG_TEXT_CHARS
      ? `${normaliseContent(content.slice(0, HEAD_TAIL_CHARS))}\u0000${normaliseContent(content.slice(-HEAD_TAIL_CHARS))}\u0000${content.length}`
      : normaliseContent(content);
  return key === '' ? null : hash53(key);
}

/**
 * cyrb53 (public domain, bryc/code): two 32-bit multiply-xorshift lanes folded to 53 bits, a safe
 * integer usable as a Map key. Among 1024 texts a collision has odds of about 1024² / 2^54 ≈ 6e-11.
 */
function hash53(s: string): number {
  let h1 = 0xdeadbeef;
  let h2 = 0x41c6ce57;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 2654435761);
    h2 = Math.imul(h2 ^ c, 1597334677);
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507) ^ Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507) ^ Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return 4294967296 * (2097151 & h2) + (h1 >>> 0);
}

/** The commonest text in the window. */
export interface TopContent {
  /** Its first CONTENT_SAMPLE_CHARS characters, as first seen (trimmed, not normalised). */
  text: string;
  count: number;
  /** Of the non-blank answers in the window. */
  share: number;
}

interface Entry {
  count: number;
  text: string;
}

/**
 * The last CONTENT_WINDOW non-blank answers of a run, counted by text. O(1) a sample: one hash,
 * one entry up and the answer leaving the window down. Blank answers are left out: they are
 * empty_content already, and the verdict should name them as empty, not as "the same text ''".
 *
 * It starts empty after a restart (the texts are in staging or the object store, not in the
 * samples): a flood is back over DUPLICATE_MIN_COUNT within a dozen answers.
 */
export class ContentCounter {
  private readonly ring: Ring;
  private readonly entries = new Map<number, Entry>();

  constructor(readonly capacity = CONTENT_WINDOW) {
    this.ring = new Ring(capacity);
  }

  /** Non-blank answers in the window. */
  get size(): number {
    return this.ring.size;
  }

  /** Counts one answer; flagged when its text holds a duplicate's share of the window, itself included. */
  observe(content: string | null): { count: number; flagged: boolean } {
    const key = contentKey(content);
    if (key === null) return { count: 0, flagged: false };
    const left = this.ring.push(key);
    if (left !== undefined) this.forget(left);
    let entry = this.entries.get(key);
    if (entry) entry.count++;
    else {
      entry = { count: 1, text: content!.trim().slice(0, CONTENT_SAMPLE_CHARS) };
      this.entries.set(key, entry);
    }
    return { count: entry.count, flagged: entry.count >= this.threshold() };
  }

  /** Copies that make a text a duplicate now. */
  threshold(): number {
    return Math.max(DUPLICATE_MIN_COUNT, Math.ceil(DUPLICATE_SHARE * this.ring.size));
  }

  /** The commonest text, or null when the window is empty. O(texts in the window): for a verdict, not per sample. */
  top(): TopContent | null {
    let best: Entry | null = null;
    for (const e of this.entries.values()) if (!best || e.count > best.count) best = e;
    return best && { text: best.text, count: best.count, share: best.count / this.ring.size };
  }

  private forget(key: number): void {
    const entry = this.entries.get(key)!;
    if (--entry.count === 0) this.entries.delete(key);
  }
}
