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
