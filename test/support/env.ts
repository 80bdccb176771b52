/**
 * Sets variables in this process's environment and returns what puts them back, key by key: the
 * suite runs file after file in one process (vitest.config.ts, isolate), and a new process.env
 * object would not undo what was set in the environment itself (a worker thread started later, as
 * a runner's is, still sees it).
 */
export function setEnv(vars: Record<string, string>): () => void {
  const before = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  Object.assign(process.env, vars);
  return () => {
    for (const [k, v] of Object.entries(before)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };
}
