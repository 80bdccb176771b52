import { readdirSync, readFileSync } from 'node:fs';
import { extname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { App } from '../../http/app.js';

const ASSETS_DIR = fileURLToPath(new URL('../../dashboard/', import.meta.url));

// Modules of the page's dependencies, by the name it imports them under from /dashboard/vendor/:
// openapi-fetch's ES module build is one file that imports nothing, so the browser loads it as is.
const VENDOR: Record<string, string> = {
  'openapi-fetch.js': fileURLToPath(import.meta.resolve('openapi-fetch')),
};

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
};

// The page only ever talks to this origin and runs no inline code, so a strict policy costs nothing
// and keeps any text that slipped through escaping from running.
const HEADERS = {
  'cache-control': 'no-cache',
  'content-security-policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
};

function loadAssets(): Map<string, { body: string; type: string }> {
  const assets = new Map<string, { body: string; type: string }>();
  for (const name of readdirSync(ASSETS_DIR)) {
    const type = TYPES[extname(name)];
    if (type) assets.set(name, { body: readFileSync(join(ASSETS_DIR, name), 'utf8'), type });
  }
  for (const [name, path] of Object.entries(VENDOR)) assets.set(`vendor/${name}`, { body: readFileSync(path, 'utf8'), type: TYPES['.js'] });
  return assets;
}

/**
 * The dashboard: static files read once at start-up and served publicly; everything it shows
 * comes from /v1, which asks for the token. Plain routes, so it stays out of the OpenAPI document.
 */
export function registerDashboard(app: App) {
  const assets = loadAssets();
  const serve = (name: string) => {
    const asset = assets.get(name);
    return asset ? new Response(asset.body, { headers: { ...HEADERS, 'content-type': asset.type } }) : undefined;
  };
  app.get('/', () => serve('index.html')!);
  // Only the names read at start-up are served: a path the request makes up finds nothing.
  app.get('/dashboard/:name', (c) => serve(c.req.param('name')) ?? c.notFound());
  app.get('/dashboard/vendor/:name', (c) => serve(`vendor/${c.req.param('name')}`) ?? c.notFound());
}
