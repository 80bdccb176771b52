import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

// The import rules of ARCHITECTURE.md as functions over a source tree, so test/layout.test.ts runs
// them on src/ and test/unit/layout-checker.test.ts on a planted tree that breaks each one.

/** One import or re-export of a module: the src-relative module it names and what it takes. */
export interface Import {
  to: string;
  /** The names taken as values; '*' for a namespace, a default or a dynamic import. */
  values: string[] | '*';
}

/** src-relative path → the modules it imports, type-only imports and re-exports included. */
export type Graph = Map<string, Import[]>;

function modules(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return modules(path);
    return /\.(ts|mjs|js)$/.test(name) ? [path] : [];
  });
}

// `import … from`, `export … from` (type-only or not), `import './x'`, and `import('./x')` (a
// dynamic import, or a type query such as the page's JSDoc `import('./api.js').Run`).
const FROM = /(?:^|\n)\s*(?:import|export)\s+(type\s+)?([^'"]*?)\s*from\s+['"](\.[^'"]+)['"]/g;
const BARE = /(?:^|\n)\s*import\s+['"](\.[^'"]+)['"]/g;
const DYNAMIC = /import\(\s*['"](\.[^'"]+)['"]\s*\)/g;

/** The value names a clause takes: `{ a, type B, c as d }` gives ['a', 'c']; `* as ns` or a default gives '*'. */
function valueNames(typeOnly: boolean, clause: string): string[] | '*' {
  if (typeOnly) return [];
  const braces = clause.match(/\{([^}]*)\}/);
  const outside = clause
    .replace(/\{[^}]*\}/, '')
    .replace(/,/g, '')
    .trim();
  if (outside || !braces) return '*';
  return braces[1]
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n && !n.startsWith('type '))
    .map((n) => n.split(/\s+as\s+/)[0]);
}

export function importGraph(src: string): Graph {
  const g: Graph = new Map();
  for (const file of modules(src)) {
    const text = readFileSync(file, 'utf8');
    const found: { spec: string; values: string[] | '*' }[] = [
      ...[...text.matchAll(FROM)].map((m) => ({ spec: m[3], values: valueNames(m[1] !== undefined, m[2]) })),
      ...[...text.matchAll(BARE)].map((m) => ({ spec: m[1], values: [] })),
      ...[...text.matchAll(DYNAMIC)].map((m) => ({ spec: m[1], values: '*' as const })),
    ];
    const imports: Import[] = [];
    for (const { spec, values } of found) {
      const written = resolve(dirname(file), spec);
      // A `.js` import names the `.ts` file beside it, a declaration file, or (in the page) itself.
      const target = [written.replace(/\.js$/, '.ts'), written.replace(/\.js$/, '.d.ts'), written].find((path) => existsSync(path)) ?? written;
      if (target.startsWith(src)) imports.push({ to: relative(src, target), values });
    }
    g.set(relative(src, file), imports);
  }
  return g;
}

/** The top folder of a module under src, or the file's own name for one at the top. */
export const layer = (path: string) => path.split('/')[0];

export interface LayerRule {
  from: string;
  may: (to: string) => boolean;
  rule: string;
}

const SERVER_TOP = ['app.ts', 'server.ts', 'cli'];

/** ARCHITECTURE.md "Import rules", one a layer. Each holds for everything a layer reaches, through any module. */
export const LAYER_RULES: LayerRule[] = [
  { from: 'domain', may: (to) => layer(to) === 'domain', rule: 'src/domain imports nothing else in src' },
  { from: 'db', may: (to) => ['db', 'domain'].includes(layer(to)), rule: 'src/db imports only src/domain' },
  {
    from: 'runner',
    may: (to) => !['services', 'routes', 'http', ...SERVER_TOP].includes(layer(to)),
    rule: 'src/runner imports neither services, routes nor http',
  },
  { from: 'services', may: (to) => !['routes', 'http', ...SERVER_TOP].includes(layer(to)), rule: 'src/services imports no routes' },
  { from: 'sim', may: (to) => layer(to) === 'sim', rule: 'src/sim stands alone' },
  // Other services import src/client: it may bring nothing of the server along.
  { from: 'client', may: (to) => to === 'client/schema.d.ts', rule: 'src/client imports nothing in src but the generated types' },
  { from: 'routes', may: (to) => !SERVER_TOP.includes(layer(to)), rule: 'routes do not import the app that registers them' },
];

/**
 * Where a layer's modules reach what the rule forbids, each with the path that gets there: a type
 * re-exported through a module at the top (deps.ts) counts as much as a direct import.
 */
export function layerViolations(g: Graph, { from, may }: LayerRule): string[] {
  const broken: string[] = [];
  for (const start of g.keys()) {
    if (layer(start) !== from) continue;
    // Breadth first, so each forbidden module is reported by its shortest path.
    const via = new Map<string, string[]>([[start, [start]]]);
    const queue = [start];
    for (let file = queue.shift(); file !== undefined; file = queue.shift()) {
      for (const { to } of g.get(file) ?? []) {
        if (via.has(to)) continue;
        const path = [...via.get(file)!, to];
        via.set(to, path);
        if (!may(to)) broken.push(path.join(' → '));
        else queue.push(to);
      }
    }
  }
  return broken;
}

export function importCycles(g: Graph): string[] {
  const cycles: string[] = [];
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (file: string) => {
    state.set(file, 'open');
    stack.push(file);
    for (const { to } of g.get(file) ?? []) {
      if (state.get(to) === 'open') cycles.push([...stack.slice(stack.indexOf(to)), to].join(' → '));
      else if (!state.has(to)) visit(to);
    }
    stack.pop();
    state.set(file, 'done');
  };
  for (const file of g.keys()) if (!state.has(file)) visit(file);
  return cycles;
}

/** What makes a statement function a write: a transaction or write slot, a row lock, or a statement that changes rows. */
const WRITES = /\.(?:tx|write|insert|update|delete)\(|\blocked\(|\b(?:insert\s+into|update\s+\w+\s+set|delete\s+from)\b/i;

/**
 * A module's top-level declarations by name, each as its text: biome leaves a multi-line one's
 * closing line at column 0 (`}`, `);`, `] as const;`), apart from a signature's `): T {`.
 */
function declarations(text: string): Map<string, string> {
  const decls = new Map<string, string>();
  const lines = text.split('\n');
  lines.forEach((line, i) => {
    const m = line.match(/^(?:export\s+)?(?:async\s+)?(?:function\*?|const|let)\s+([A-Za-z_$][\w$]*)/);
    if (!m) return;
    let end = i;
    if (!/;\s*$/.test(line)) while (end + 1 < lines.length && !/^(?:\}|\)|\])[^{]*$/.test(lines[end])) end++;
    decls.set(m[1], lines.slice(i, end + 1).join('\n'));
  });
  return decls;
}

/** Whether a declaration, or any of its module's declarations it names, writes. */
function writes(decls: Map<string, string>, name: string, seen = new Set<string>()): boolean {
  const text = decls.get(name);
  if (text === undefined || seen.has(name)) return false;
  seen.add(name);
  if (WRITES.test(text)) return true;
  return [...decls.keys()].some((other) => other !== name && new RegExp(`\\b${other.replace(/\$/g, '\\$')}\\b`).test(text) && writes(decls, other, seen));
}

/**
 * ARCHITECTURE.md's route rule: a route reads the store directly and changes it only through a
 * service. Its value imports from src/db must be read queries (or constants): declarations of the
 * module that hold no transaction, write slot, row lock or insert/update/delete, nor name a
 * declaration of that module that does. Type-only imports are free.
 */
export function routeWrites(src: string, g: Graph): string[] {
  const broken: string[] = [];
  for (const [file, imports] of g) {
    if (layer(file) !== 'routes') continue;
    for (const { to, values } of imports) {
      if (layer(to) !== 'db') continue;
      if (values === '*') {
        broken.push(`${file} → ${to}: takes the whole module`);
        continue;
      }
      const decls = declarations(readFileSync(join(src, to), 'utf8'));
      for (const name of values) {
        if (!decls.has(name)) broken.push(`${file} → ${to} ${name}: not a declaration of that module`);
        else if (writes(decls, name)) broken.push(`${file} → ${to} ${name}: writes`);
      }
    }
  }
  return broken;
}
