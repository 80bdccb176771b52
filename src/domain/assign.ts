import { createHash } from 'node:crypto';

/**
 * Stable per-sample choices decided by the `custom_id` alone, so the same input line gets the same
 * answer in every run and after every restart or retry. Each use has its own salt: a sample's
 * variant and its split are drawn from independent hashes, so a split's share of each variant is
 * the variant's share of the run.
 */
export const ASSIGN_SALTS = { variant: 'regen/variant/v1', split: 'regen/split/v1' } as const;

/** A number in [0, 1) from the first 48 bits of sha256(salt, NUL, customId): uniform and stable. */
export function stableFraction(customId: string, salt: string): number {
  const digest = createHash('sha256').update(salt).update('\0').update(customId).digest();
  return digest.readUIntBE(0, 6) / 2 ** 48;
}

/** The index of the weight a sample falls under, weights taken in order (all > 0). */
export function pickWeighted(customId: string, weights: readonly number[], salt: string): number {
  const total = weights.reduce((a, w) => a + w, 0);
  let at = stableFraction(customId, salt) * total;
  for (let i = 0; i < weights.length; i++) {
    at -= weights[i] as number;
    if (at < 0) return i;
  }
  return weights.length - 1;
}

export const SPLIT_NAMES = ['train', 'eval'] as const;
export type SplitName = (typeof SPLIT_NAMES)[number];

/** `eval` for a stable `evalShare` of custom ids, `train` for the rest. */
export function pickSplit(customId: string, evalShare: number): SplitName {
  return stableFraction(customId, ASSIGN_SALTS.split) < evalShare ? 'eval' : 'train';
}
