import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { renderOpenApiTypes, renderOpenApiYaml } from '../src/openapi-file.js';

// `npm run openapi`: writes the document the routes describe to openapi.yaml, and the client's
// types generated from it to src/client/schema.d.ts; both are checked in.
const yaml = renderOpenApiYaml();
for (const [path, text] of [
  ['../openapi.yaml', yaml],
  ['../src/client/schema.d.ts', await renderOpenApiTypes(yaml)],
] as const) {
  const target = fileURLToPath(new URL(path, import.meta.url));
  writeFileSync(target, text);
  console.log(`wrote ${target}`);
}
