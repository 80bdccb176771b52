import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

// The import rules of ARCHITECTURE.md, checked on the source itself: every relative import of
// every module under src/, type-only imports included.

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const src = join(root, 'src');

function modules(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return modules(path);
    return /\.(ts|mjs|js)$/.test(name) ? [path] : [];
  });
}

const IMPORT = /(?:^|\n)\s*(?:import|export)\s[^'"]*?from\s+['"](\.[^'"]+)['"]|import\(\s*['"](\.[^'"]+)['"]\s*\)/g;

/** src-relative paths of the modules each module imports. */
function graph(): Map<string, string[]> {
  const g = new Map<string, string[]>();
  for (const file of modules(src)) {
    const text = readFileSync(file, 'utf8');
    const deps: string[] = [];
    for (const m of text.matchAll(IMPORT)) {
      const spec = m[1] ?? m[2];
      const written = resolve(dirname(file), spec);
      // A `.js` import names the `.ts` file beside it, a declaration file, or (in the page) itself.
      const target = [written.replace(/\.js$/, '.ts'), written.replace(/\.js$/, '.d.ts'), written].find((path) => existsSync(path)) ?? written;
      if (target.startsWith(src)) deps.push(relative(src, target));
    }
    g.set(relative(src, file), deps);
  }
  return g;
}

const layer = (path: string) => path.split('/')[0];

describe('the layout', () => {
  const g = graph();

  it('finds the modules and their imports', () => {
    // A broken walk would pass every rule below; these prove it reads what is there.
    expect(g.size).toBeGreaterThan(80);
    expect(g.get('runner/runner.ts')).toContain('runner/claim-buffer.ts');
    expect(g.get('client/index.ts')).toContain('client/schema.d.ts');
    expect(g.get('dashboard/app.js')).toContain('dashboard/api.js');
  });

  const rules: { from: string; may: (to: string) => boolean; rule: string }[] = [
    { from: 'domain', may: (to) => layer(to) === 'domain', rule: 'src/domain imports nothing else in src' },
    { from: 'db', may: (to) => ['db', 'domain'].includes(layer(to)), rule: 'src/db imports only src/domain' },
    {
      from: 'runner',
      may: (to) => !['services', 'routes', 'http', 'app.ts', 'server.ts', 'cli'].includes(layer(to)),
      rule: 'src/runner imports neither services, routes nor http',
    },
    { from: 'services', may: (to) => !['routes', 'http', 'app.ts', 'server.ts', 'cli'].includes(layer(to)), rule: 'src/services imports no routes' },
    { from: 'sim', may: (to) => layer(to) === 'sim', rule: 'src/sim stands alone' },
    // Other services import src/client: it may bring nothing of the server along.
    { from: 'client', may: (to) => to === 'client/schema.d.ts', rule: 'src/client imports nothing in src but the generated types' },
    { from: 'routes', may: (to) => !['app.ts', 'server.ts', 'cli'].includes(layer(to)), rule: 'routes do not import the app that registers them' },
  ];
  for (const { from, may, rule } of rules) {
    it(rule, () => {
      const broken = [...g].filter(([file]) => layer(file) === from).flatMap(([file, deps]) => deps.filter((d) => !may(d)).map((d) => `${file} → ${d}`));
      expect(broken).toEqual([]);
    });
  }

  it('has tsc check every module of the page against the generated types', () => {
    // allowJs takes the page's modules in; `// @ts-check` on each is what makes tsc check them.
    const unchecked = [...g.keys()].filter(
      (f) => layer(f) === 'dashboard' && f.endsWith('.js') && !readFileSync(join(src, f), 'utf8').startsWith('// @ts-check\n'),
    );
    expect(unchecked).toEqual([]);
  });

  it('has no import cycles', () => {
    const cycles: string[] = [];
    const state = new Map<string, 'open' | 'done'>();
    const stack: string[] = [];
    const visit = (file: string) => {
      state.set(file, 'open');
      stack.push(file);
      for (const dep of g.get(file) ?? []) {
        if (state.get(dep) === 'open') cycles.push([...stack.slice(stack.indexOf(dep)), dep].join(' → '));
        else if (!state.has(dep)) visit(dep);
      }
      stack.pop();
      state.set(file, 'done');
    };
    for (const file of g.keys()) if (!state.has(file)) visit(file);
    expect(cycles).toEqual([]);
  });

  it('keeps store and sharing checks in src/db and src/runner/fleet', () => {
    // The fleet is chosen once from the store (src/runner/fleet/index.ts); everything else asks it
    // or a src/db function, never which store or mode it runs on: no `dialect`, no `'pg'`, no
    // `.shared` or `.coordinating` flag.
    const check = /\bdialect\b|\.(shared|coordinating)\b|['"]pg['"]/i;
    const leaks = [...g.keys()].filter((f) => layer(f) !== 'db' && !f.startsWith('runner/fleet/') && check.test(readFileSync(join(src, f), 'utf8')));
    expect(leaks).toEqual([]);
  });

  it('keeps every file of src/runner under 400 lines', () => {
    const MAX_LINES = 400;
    const lines = (f: string) => readFileSync(join(src, f), 'utf8').trimEnd().split('\n').length;
    const long = [...g.keys()].filter((f) => layer(f) === 'runner' && lines(f) > MAX_LINES).map((f) => `${f}: ${lines(f)} lines`);
    expect(long).toEqual([]);
  });
});
