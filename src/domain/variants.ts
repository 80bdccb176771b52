import { z } from 'zod';
import { ASSIGN_SALTS, pickWeighted } from './assign.js';
import { Params } from './params.js';

// A run's variants (README "Variants"): named sets of params, each taken by a stable share of the
// samples, chosen by custom_id alone (domain/assign.ts), so the same input gets the same variant in
// every run and after every restart. Params are laid run, then variant, then line (`layeredParams`,
// run-settings.ts).

export const MAX_VARIANTS = 16;
export const VARIANT_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

export const Variant = z
  .object({
    name: z.string().regex(VARIANT_NAME, 'must be 1 to 64 letters, digits, "_", "." or "-"'),
    weight: z.number().gt(0, 'must be more than 0').max(1_000_000),
    params: Params.optional(),
  })
  .strict();

export const Variants = z
  .array(Variant)
  .min(1, 'must hold at least one variant')
  .max(MAX_VARIANTS, `at most ${MAX_VARIANTS} variants`)
  .superRefine((vs, ctx) => {
    const seen = new Set<string>();
    for (const [i, v] of vs.entries()) {
      if (seen.has(v.name)) ctx.addIssue({ code: 'custom', path: [i, 'name'], message: `${JSON.stringify(v.name)} is used twice: names must be unique` });
      seen.add(v.name);
      // One request a sample per variant: how many answers a prompt gets is the run's to say.
      if (v.params && 'n' in v.params)
        ctx.addIssue({ code: 'custom', path: [i, 'params', 'n'], message: 'n is set on the run only (params.n), not per variant' });
    }
  });

export type Variant = z.infer<typeof Variant>;

/** The index of a sample's variant, or null when the run has none. */
export function variantIndex(customId: string, variants: readonly Pick<Variant, 'weight'>[] | null | undefined): number | null {
  if (!variants?.length) return null;
  return pickWeighted(
    customId,
    variants.map((v) => v.weight),
    ASSIGN_SALTS.variant,
  );
}

/** A variant's name by its stored index; null for none (or an index the run no longer has). */
export function variantName(variants: readonly Pick<Variant, 'name'>[] | null | undefined, index: number | null | undefined): string | null {
  if (index === null || index === undefined || !variants) return null;
  return variants[index]?.name ?? null;
}
