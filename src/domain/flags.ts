// Quality flags (docs/design.md "Quality"). They are stored as a bitmask in samples.flags, so the
// order of FLAGS is part of the stored format: append only. Each flag also has a counter on its run.

export const FLAGS = [
  'empty_content',
  'missing_reasoning',
  'truncated',
  'repetitive',
  'too_short',
  'duplicate_content',
  'think_in_content',
  'short_for_run',
  // Tool calls (README "Agentic conversations").
  'tool_call_in_content',
  'invalid_tool_arguments',
  'unknown_tool',
  /** The source's tool results could not be paired with the target's calls: describes the data, not the server. */
  'tool_mismatch',
  /** Fewer generated (trainable) tokens than quality.min_trainable_tokens in an answer not cut: runs with output.tokens. */
  'few_trainable',
] as const;
export type Flag = (typeof FLAGS)[number];

export function flagBit(f: Flag): number {
  return 1 << FLAGS.indexOf(f);
}

/** Flags the quality gate does not judge: they describe the input, not the answers. */
export const GATE_EXEMPT_BITS = flagBit('tool_mismatch');

export function flagsFromBits(bits: number): Flag[] {
  return FLAGS.filter((f) => (bits & flagBit(f)) !== 0);
}

export function bitsFromFlags(flags: readonly Flag[]): number {
  return flags.reduce((bits, f) => bits | flagBit(f), 0);
}

const camel = (s: string) => s.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

/** The run counter of each flag: its SQL column and its property on a run row. */
export const FLAG_COLUMNS = FLAGS.map((flag) => ({
  flag,
  column: `flag_${flag}`,
  key: camel(`flag_${flag}`) as FlagCounterKey,
}));
export type FlagCounterKey = `flag${Capitalize<CamelCase<Flag>>}`;
type CamelCase<S extends string> = S extends `${infer H}_${infer T}` ? `${H}${Capitalize<CamelCase<T>>}` : S;

/** A run row's flag counters by flag name. */
export function flagCounts(counters: Record<FlagCounterKey, number>): Record<Flag, number> {
  return Object.fromEntries(FLAG_COLUMNS.map(({ flag, key }) => [flag, counters[key]])) as Record<Flag, number>;
}

/** How many samples carry each flag, counted from their bitmasks. */
export function countFlags(bitmasks: Iterable<number>): Record<Flag, number> {
  const counts = Object.fromEntries(FLAGS.map((f) => [f, 0])) as Record<Flag, number>;
  for (const bits of bitmasks) for (const f of FLAGS) if (bits & flagBit(f)) counts[f]++;
  return counts;
}
