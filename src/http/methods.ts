interface RoutePattern {
  method: string;
  pattern: RegExp;
  /** A path without parameters (`/v1/runs/validate`): it names one resource, whatever a parameterised path also matches. */
  literal: boolean;
}

/** A hono path (`/v1/runs/:id/samples/:custom_id`, `/dashboard/*`) as a regex over a request path. */
function compile(path: string): RegExp {
  const body = path
    .split('/')
    .map((segment) => (segment.startsWith(':') ? '[^/]+' : segment === '*' ? '.*' : segment.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')))
    .join('/');
  return new RegExp(`^${body}$`);
}

/**
 * The methods an app answers on a path, read from its route table the first time it is asked (all
 * routes are registered by then), so a request with another method can be told what to use (405 with
 * `Allow`) rather than that the path does not exist. Middleware (`ALL`) is not a route.
 */
export function allowedMethods(app: { routes: { method: string; path: string }[] }): (path: string, literalOnly?: boolean) => string[] {
  let routes: RoutePattern[] | undefined;
  return (path, literalOnly = false) => {
    routes ??= app.routes.filter((r) => r.method !== 'ALL').map((r) => ({ method: r.method, pattern: compile(r.path), literal: !/[:*]/.test(r.path) }));
    const methods = new Set(routes.filter((r) => (!literalOnly || r.literal) && r.pattern.test(path)).map((r) => r.method));
    // hono answers HEAD with the GET route, less the body.
    if (methods.has('GET')) methods.add('HEAD');
    return [...methods].sort();
  };
}
