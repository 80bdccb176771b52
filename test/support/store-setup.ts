import { afterAll } from 'vitest';
import { dropTestDatabases } from './store.js';

// The `pg` project's setup file (vitest.config.ts): after each test file, the databases its
// servers used are dropped, whatever its tests did.
afterAll(dropTestDatabases);
