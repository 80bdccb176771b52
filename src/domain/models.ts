// Which runs an endpoint can serve (docs/sglang.md "Models"). SGLang serves a model under the name it
// was launched with, which defaults to --model-path: often a local folder such as
// /models/Qwen3-27B rather than the hub name Qwen/Qwen3-27B that a run names.

/** The part after the last slash: `/models/Qwen3-27B/` and `Qwen/Qwen3-27B` both give `Qwen3-27B`. */
export function lastSegment(name: string): string {
  const trimmed = name.replace(/\/+$/, '');
  return trimmed.slice(trimmed.lastIndexOf('/') + 1);
}

/** A served name that is a filesystem path, as SGLang's default --served-model-name is. */
export function isPathLike(name: string): boolean {
  return name.startsWith('/') || name.startsWith('./') || name.startsWith('../') || name.startsWith('~/');
}

/**
 * Whether an endpoint serving `served` (and answering to `aliases`) serves the run's `model`: the
 * same name, an alias, or a path-like served name whose last segment is the model's last segment.
 */
export function servesModel(served: string | null, aliases: readonly string[], model: string): boolean {
  if (served === model || aliases.includes(model)) return true;
  return served !== null && isPathLike(served) && lastSegment(served) === lastSegment(model);
}

/** Edits (insertions, deletions, substitutions) between two names, case aside: a case slip costs nothing. */
function editDistance(a: string, b: string): number {
  const x = a.toLowerCase();
  const y = b.toLowerCase();
  let prev = Array.from({ length: y.length + 1 }, (_, j) => j);
  for (let i = 1; i <= x.length; i++) {
    const row = [i];
    for (let j = 1; j <= y.length; j++) row[j] = Math.min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (x[i - 1] === y[j - 1] ? 0 : 1));
    prev = row;
  }
  return prev[y.length];
}

/** Suggestions offered at most: enough for a typo between two sizes of one family, few enough to read. */
const MAX_SUGGESTIONS = 3;
/**
 * A served name is offered when at most a third of the run's name (or of its last segment) would have
 * to change: `Qwen3-8b` → `Qwen3-8B` or `Qwen3-14B`, not `Llama-3.1-70B`.
 */
const CLOSE_FRACTION = 1 / 3;

/**
 * The served names closest to `model`, best first: each compared whole and by its last path segment
 * (served names are often local paths such as `/models/Qwen3-8B` where the run says `Qwen/Qwen3-8B`).
 */
export function closestModels(model: string, served: readonly string[]): string[] {
  const scored = [...new Set(served)].map((name) => {
    const whole = editDistance(model, name) / Math.max(model.length, name.length, 1);
    const a = lastSegment(model);
    const b = lastSegment(name);
    const segment = editDistance(a, b) / Math.max(a.length, b.length, 1);
    return { name, score: Math.min(whole, segment) };
  });
  return scored
    .filter((s) => s.score <= CLOSE_FRACTION)
    .sort((p, q) => p.score - q.score || p.name.localeCompare(q.name))
    .slice(0, MAX_SUGGESTIONS)
    .map((s) => s.name);
}
