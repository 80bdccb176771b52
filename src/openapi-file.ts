import openapiTS, { astToString, COMMENT_HEADER } from 'openapi-typescript';
import { stringify } from 'yaml';
import { createApp } from './app.js';
import type { Deps } from './deps.js';
import { openApiDocument } from './routes/service/openapi.js';

/** The OpenAPI document as YAML, built from the routes alone (no database, no runner needed). */
export function renderOpenApiYaml(): string {
  const app = createApp({ config: { apiTokens: [], maxBodyBytes: 1 } } as unknown as Deps);
  return stringify(openApiDocument(app), { lineWidth: 0, sortMapEntries: false });
}

/** The TypeScript types of that document (`paths`, `components`, `operations`), as openapi-typescript writes them. */
export async function renderOpenApiTypes(yaml: string = renderOpenApiYaml()): Promise<string> {
  return COMMENT_HEADER + astToString(await openapiTS(yaml));
}
