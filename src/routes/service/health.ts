import { createRoute, z } from '@hono/zod-openapi';
import { pingDb } from '../../db/client.js';
import type { App } from '../../http/app.js';
import { jsonContent } from '../common.js';
import type { Deps } from '../../deps.js';
import { probeKey } from '../../storage/store.js';

const Health = z.object({ status: z.enum(['ok', 'unavailable']), checks: z.record(z.string(), z.string()).optional() }).openapi('Health');

const healthz = createRoute({
  method: 'get',
  path: '/healthz',
  operationId: 'getHealth',
  tags: ['service'],
  summary: 'The process is alive',
  responses: { 200: jsonContent(Health, 'Alive') },
});

const readyz = createRoute({
  method: 'get',
  path: '/readyz',
  operationId: 'getReadiness',
  tags: ['service'],
  summary: 'The database and the object store are reachable',
  responses: { 200: jsonContent(Health, 'Ready'), 503: jsonContent(Health, 'Not ready; `checks` says which dependency failed') },
});

/**
 * How long one successful write check (an object written, fsynced and deleted) answers for the
 * store on this unauthenticated route: a load balancer polling every second must not turn into a
 * second's writes. Between writes a read still finds a store that is down.
 */
const STORE_WRITE_CHECK_MS = 30_000;

export function registerHealth(app: App) {
  let storeWrittenAt = Number.NEGATIVE_INFINITY;
  const checkStore = async (deps: Deps) => {
    const store = deps.stores.forUri(deps.config.outputUri);
    const now = deps.clock();
    if (now - storeWrittenAt < STORE_WRITE_CHECK_MS) {
      await store.head(probeKey());
      return;
    }
    await store.check();
    storeWrittenAt = now;
  };
  app.openapi(healthz, (c) => c.json({ status: 'ok' as const }, 200));
  app.openapi(readyz, async (c) => {
    const deps = c.get('deps');
    const checks: Record<string, string> = {};
    try {
      await pingDb(deps.db);
      checks.database = 'ok';
    } catch {
      checks.database = 'unavailable';
    }
    try {
      await checkStore(deps);
      checks.object_store = 'ok';
    } catch (err) {
      deps.logger.warn({ err: { message: (err as Error).message } }, 'object store check failed');
      checks.object_store = 'unavailable';
    }
    const ok = Object.values(checks).every((v) => v === 'ok');
    return c.json({ status: ok ? ('ok' as const) : ('unavailable' as const), checks }, ok ? 200 : 503);
  });
}
