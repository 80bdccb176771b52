import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { type Graph, importCycles, importGraph, LAYER_RULES, layerViolations, routeWrites } from '../support/layout.js';

// The checker test/layout.test.ts runs on src/, run here on a tree that breaks each rule, so a
// checker that went blind (and passed everything) fails here.

const planted: Record<string, string> = {
  'domain/a.ts': "import { b } from './b.js';\nexport const a = () => b;\n",
  'domain/b.ts': "import { a } from './a.js';\nexport const b = () => a;\n",
  'services/metrics.ts': 'export interface Metrics {\n  count(): void;\n}\n',
  // The type reaches the runner only through a re-export in a module at the top.
  'deps.ts': "export type { Metrics } from './services/metrics.js';\n",
  'runner/loop.ts': "import type { Metrics } from '../deps.js';\nexport const tick = (m: Metrics) => m.count();\n",
  'db/things.ts': [
    "const MARK = 'update things set seen = 1';",
    'export interface ThingRow {',
    '  id: string;',
    '}',
    'export async function getThing(db: Db, id: string) {',
    '  return db.q.select().from(things).where(eq(things.id, id));',
    '}',
    'export async function insertThing(db: Db, row: ThingRow) {',
    '  await db.write((w) => w.q.insert(things).values(row));',
    '}',
    '/** Reads, and marks through a statement of the module. */',
    'export async function readAndMark(db: Db) {',
    '  await db.exec(MARK);',
    '}',
    '',
  ].join('\n'),
  'routes/things/get.ts': [
    "import { getThing, type ThingRow } from '../../db/things.js';",
    "import type { ThingRow as Row } from '../../db/things.js';",
    "import { insertThing, readAndMark } from '../../db/things.js';",
    "import * as things from '../../db/things.js';",
    '',
  ].join('\n'),
};

const dir = mkdtempSync(join(tmpdir(), 'regen-layout-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const src = join(dir, 'src');
for (const [path, text] of Object.entries(planted)) {
  mkdirSync(dirname(join(src, path)), { recursive: true });
  writeFileSync(join(src, path), text);
}

describe('the layout checker', () => {
  const g = importGraph(src);
  const broken = (from: string) => LAYER_RULES.filter((r) => r.from === from).flatMap((r) => layerViolations(g, r));

  it('follows a type-only import through a re-export to the layer it may not reach', () => {
    expect(broken('runner')).toEqual(['runner/loop.ts → deps.ts → services/metrics.ts']);
    // The top module itself belongs to no layer: its re-export alone breaks nothing.
    expect(broken('services')).toEqual([]);
  });

  it('finds a cycle', () => {
    expect(importCycles(g)).toEqual(['domain/a.ts → domain/b.ts → domain/a.ts']);
  });

  it("refuses a route's writing imports from src/db, and only those", () => {
    expect(routeWrites(src, g)).toEqual([
      'routes/things/get.ts → db/things.ts insertThing: writes',
      'routes/things/get.ts → db/things.ts readAndMark: writes',
      'routes/things/get.ts → db/things.ts: takes the whole module',
    ]);
  });

  it("tells src/db's reads from its writes", () => {
    const realSrc = resolve(dirname(fileURLToPath(import.meta.url)), '../../src');
    const reads = ['getRun', 'listRuns', 'getSample', 'listSamples', 'qualityHistograms', 'HISTOGRAM_EDGES'];
    const writes = ['transitionRun', 'insertRun', 'lockRun', 'claimSamples', 'cancelPendingSamples', 'markShardUploaded'];
    const modules: Record<string, string> = {
      getRun: 'db/runs.ts',
      listRuns: 'db/runs.ts',
      transitionRun: 'db/runs.ts',
      insertRun: 'db/runs.ts',
      lockRun: 'db/runs.ts',
      getSample: 'db/samples.ts',
      listSamples: 'db/samples.ts',
      claimSamples: 'db/samples.ts',
      cancelPendingSamples: 'db/samples.ts',
      qualityHistograms: 'db/quality.ts',
      HISTOGRAM_EDGES: 'db/quality.ts',
      markShardUploaded: 'db/shards.ts',
    };
    const route: Graph = new Map([['routes/probe.ts', [...reads, ...writes].map((name) => ({ to: modules[name], values: [name] }))]]);
    expect(routeWrites(realSrc, route)).toEqual(writes.map((name) => `routes/probe.ts → ${modules[name]} ${name}: writes`));
  });
});
