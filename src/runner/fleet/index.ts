import type { RunnerDeps } from '../../deps.js';
import type { EndpointPool } from '../endpoints.js';
import type { RunnerLock } from '../lock.js';
import { AloneFleet } from './alone.js';
import type { Fleet, FleetHooks } from './fleet.js';
import { ReplicaFleet } from './replica.js';

/** The store decides, once: SQLite has one dispatcher; PostgreSQL lets every replica dispatch. */
export function createFleet(deps: RunnerDeps, owner: string, lock: RunnerLock, pool: EndpointPool, hooks: FleetHooks): Fleet {
  return deps.db.dialect === 'pg' ? new ReplicaFleet(deps, owner, lock, pool, hooks) : new AloneFleet(deps, lock, pool, hooks);
}
