// Copies a subset of OpenAI's published schemas (github.com/openai/openai-openapi) into
// test/fixtures/openai-openapi/: the named schemas and every schema they reference, unchanged.
// Usage: tsx scripts/vendor-openai-schemas.ts <openapi.yaml> <out.yaml> <Schema>...
import { readFileSync, writeFileSync } from 'node:fs';
import { parse, stringify } from 'yaml';

const [source, out, ...roots] = process.argv.slice(2);
if (!source || !out || roots.length === 0) throw new Error('usage: vendor-openai-schemas <openapi.yaml> <out.yaml> <Schema>...');
const doc = parse(readFileSync(source, 'utf8')) as { openapi: string; components: { schemas: Record<string, unknown> } };
const all = doc.components.schemas;

const REF = '#/components/schemas/';
const picked: Record<string, unknown> = {};
function refsOf(node: unknown, found: Set<string>): Set<string> {
  if (Array.isArray(node)) for (const n of node) refsOf(n, found);
  else if (node && typeof node === 'object') {
    for (const [k, v] of Object.entries(node)) {
      if (k === '$ref' && typeof v === 'string' && v.startsWith(REF)) found.add(v.slice(REF.length));
      else refsOf(v, found);
    }
  }
  return found;
}
const queue = [...roots];
while (queue.length) {
  const name = queue.shift()!;
  if (name in picked) continue;
  if (!(name in all)) throw new Error(`${name} is not a schema of ${source}`);
  picked[name] = all[name];
  queue.push(...refsOf(all[name], new Set()));
}
const sorted = Object.fromEntries(
  Object.keys(picked)
    .sort()
    .map((k) => [k, picked[k]]),
);
writeFileSync(out, stringify({ openapi: doc.openapi, components: { schemas: sorted } }, { lineWidth: 0 }));
console.log(`${Object.keys(sorted).length} schemas: ${Object.keys(sorted).join(', ')}`);
