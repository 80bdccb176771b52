import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { renderOpenApiYaml } from '../src/openapi-file.js';

// `npm run openapi`: writes the document the routes describe to openapi.yaml, to be checked in.
const target = fileURLToPath(new URL('../openapi.yaml', import.meta.url));
writeFileSync(target, renderOpenApiYaml());
console.log(`wrote ${target}`);
