import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type BuildOptions, buildSync } from 'esbuild';
import { BUNDLE_OPTIONS } from '../scripts/build.js';
import { describe, expect, it } from 'vitest';
import { importCycles, importGraph, LAYER_RULES, layer, layerViolations, routeWrites } from './support/layout.js';

// The import rules of ARCHITECTURE.md, checked on the source itself: every relative import of
// every module under src/, type-only imports and re-exports included, followed to the end.

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const src = join(root, 'src');

describe('the layout', () => {
  const g = importGraph(src);
  const targets = (file: string) => (g.get(file) ?? []).map((i) => i.to);

  it('finds the modules and their imports', () => {
    // A broken walk would pass every rule below; these prove it reads what is there.
    expect(g.size).toBeGreaterThan(80);
    expect(targets('runner/runner.ts')).toContain('runner/claim-buffer.ts');
    expect(targets('client/index.ts')).toContain('client/schema.d.ts');
    expect(targets('dashboard/app.js')).toContain('dashboard/api.js');
    expect(targets('deps.ts')).toContain('db/client.ts');
  });

  for (const rule of LAYER_RULES) {
    it(rule.rule, () => {
      expect(layerViolations(g, rule)).toEqual([]);
    });
  }

  it('has routes change the store only through services', () => {
    expect(routeWrites(src, g)).toEqual([]);
  });

  it('has tsc check every module of the page against the generated types', () => {
    // allowJs takes the page's modules in; `// @ts-check` on each is what makes tsc check them.
    const unchecked = [...g.keys()].filter(
      (f) => layer(f) === 'dashboard' && f.endsWith('.js') && !readFileSync(join(src, f), 'utf8').startsWith('// @ts-check\n'),
    );
    expect(unchecked).toEqual([]);
  });

  it("cites only the repository's own docs, by sections they have", () => {
    // A comment's citation may wrap: `(docs/design.md "Words and` / `// statuses")`.
    const cites: { f: string; doc: string; section: string | null }[] = [];
    for (const f of g.keys()) {
      const text = readFileSync(join(src, f), 'utf8').replace(/\n\s*(?:\/\/|\*)\s*/g, ' ');
      for (const [, doc, sections] of text.matchAll(/docs\/([\w-]+\.md)((?:,? "[^"]+")*)/g)) {
        if (!sections) cites.push({ f, doc, section: null });
        for (const [, section] of sections.matchAll(/"([^"]+)"/g)) cites.push({ f, doc, section });
      }
    }
    expect(cites.length).toBeGreaterThan(15);
    const headings = (doc: string): string[] | null => {
      const path = join(root, 'docs', doc);
      return existsSync(path) ? (readFileSync(path, 'utf8').match(/^## .+$/gm) ?? []) : null;
    };
    const broken = cites.filter(({ doc, section }) => {
      const h = headings(doc);
      return h === null || (section !== null && !h.includes(`## ${section}`));
    });
    expect(broken).toEqual([]);
  });

  it('has no import cycles', () => {
    const cycles = importCycles(g);
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

  it('starts the runner thread without zod, and without the Parquet modules until it first writes or reads Parquet', () => {
    // What the thread's entry loads before it runs (its static imports, followed through every
    // chunk), bundled as the build bundles it (scripts/build.js): the schemas stay on the API thread,
    // the Parquet reader and writer wait for the first Parquet shard (BENCHMARKS.md, 2026-12-07, ninth session).
    const { metafile } = buildSync({
      ...(BUNDLE_OPTIONS as BuildOptions),
      entryPoints: [join(src, 'runner/worker.ts')],
      outdir: join(root, 'node_modules/.cache/layout-bundle'),
      metafile: true,
      write: false,
    });
    const outputs = metafile.outputs;
    const entry = Object.keys(outputs).find((o) => outputs[o]!.entryPoint?.endsWith('runner/worker.ts'))!;
    const loaded = new Set([entry]);
    for (const out of loaded) for (const i of outputs[out]!.imports) if (i.kind === 'import-statement' && i.path in outputs) loaded.add(i.path);
    const packages = (outs: Iterable<string>) =>
      new Set([...outs].flatMap((o) => Object.keys(outputs[o]!.inputs)).flatMap((f) => f.match(/.*node_modules\/((?:@[^/]+\/)?[^/]+)\//)?.[1] ?? []));
    const atStart = packages(loaded);
    const onUse = packages(Object.keys(outputs));
    // The walk is real: the thread does load its other packages at start, and the bundle holds the Parquet ones for later.
    expect([...atStart]).toEqual(expect.arrayContaining(['drizzle-orm', 'openai']));
    expect([...onUse]).toEqual(expect.arrayContaining(['hyparquet', 'hyparquet-writer']));
    expect([...atStart].filter((p) => p === 'zod' || p.startsWith('hyparquet'))).toEqual([]);
  });

  it('keeps every file of src/runner under 400 lines', () => {
    const MAX_LINES = 400;
    const lines = (f: string) => readFileSync(join(src, f), 'utf8').trimEnd().split('\n').length;
    const long = [...g.keys()].filter((f) => layer(f) === 'runner' && lines(f) > MAX_LINES).map((f) => `${f}: ${lines(f)} lines`);
    expect(long).toEqual([]);
  });
});
