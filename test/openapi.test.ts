import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { renderOpenApiTypes, renderOpenApiYaml } from '../src/openapi-file.js';
import { startTestServer } from './support/server.js';

describe('openapi.yaml', () => {
  it('matches what the routes produce (run `npm run openapi` after changing them)', () => {
    const checkedIn = readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8');
    expect(checkedIn).toBe(renderOpenApiYaml());
  });

  it('has its client types in src/client/schema.d.ts generated from it (run `npm run openapi`)', async () => {
    const checkedIn = readFileSync(new URL('../src/client/schema.d.ts', import.meta.url), 'utf8');
    expect(checkedIn).toBe(await renderOpenApiTypes());
  });

  it('is the document the server serves at /openapi.json', async () => {
    const server = await startTestServer({ REGEN_RUNNER: 'false' });
    try {
      const served = await (await fetch(`${server.url}/openapi.json`)).json();
      const file = parse(readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8'));
      expect(served).toEqual(file);
      expect(Object.keys(served.paths)).toEqual(expect.arrayContaining(['/v1/runs', '/v1/files', '/v1/endpoints', '/v1/runs/{id}']));
    } finally {
      await server.cleanup();
    }
  });
});
